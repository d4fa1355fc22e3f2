"""The fabric: every transport of this rank, and which one reaches each peer.

Bootstrap hands each authenticated TCP connection to the fabric; :meth:`Fabric.finish`
then decides, per peer, which transport carries data — the first whose
``can_connect`` accepts, in preference order (shared memory before TCP on one
host, as NCCL picks the first transport that can connect). ``UNISON_TRANSPORT``
forces one. The communicator talks to the fabric only (it is the algorithms'
``Router``), never to a transport directly.

Shared-memory set-up, over the already authenticated TCP connections:

1. every rank creates its segment and sends each same-host peer a *hello*
   (segment path and layout, pid, a token for the cross-memory-attach probe);
2. each maps its peers' segments and answers with an *ack* (mapped or not);
   a pair uses shared memory only when both sides mapped — both decide alike;
3. once every ack is in, the owner unlinks its segment (the mappings live on,
   so no file outlives this point even if the rank is killed);
4. a *summary* to every rank (all my peers on shm?) makes the link model — and
   so every algorithm choice — identical on all ranks.

TCP stays connected to every peer: control frames and liveness (a dead rank is
noticed by its socket closing) go that way whatever carries the data.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..._types import OpSig
from ...algorithms import shm_arena
from ...config import ENV_JOB_ID, Config
from ...errors import CollectiveTimeoutError, PeerLostError, UnsupportedError
from ...link import Link, shared_link, transport_link, two_level
from ...log import get_logger
from ...transport import cma
from ...transport.arena import Arena
from ...transport.base import Events, Key, PeerInfo, Transport
from ...transport.framing import FrameKind
from ...transport.matching import ANY_SOURCE
from ...transport.request import Request
from ...transport.seqslot import SeqSlots, region_bytes
from ...transport.shm import ShmRequest, ShmTransport
from ...transport.shm_ring import Ring
from ...transport.shm_segment import Segment, layout_of
from ...transport.tcp import TcpTransport

__all__ = ["RING_BYTES", "Fabric"]

log = get_logger("fabric")

#: bytes of each shared-memory ring (one per ordered pair of same-host ranks)
RING_BYTES = 1 << 19
_FABRIC_GROUP = 0xFFFFFFFF  # group id of the fabric's own set-up messages
_HELLO, _ACK, _SUMMARY = 1, 2, 3
_MSG = 2048
_GARENA_MIN = 4096  # a sub-group arena smaller than this is not worth its rounds
_GARENA_TAG = 1 << 16  # + group id: the tag of a sub-group's arena agreement


def allocate(seg: Segment, offset: int, length: int, what: str) -> None:
    """Allocate a range of this rank's segment (a hook: tests make it fail)."""
    seg.reserve(offset, length, what)


class Fabric:
    def __init__(self, rank: int, events: Events, config: Config) -> None:
        self.rank = rank
        self.config = config
        self.events = events
        inner = Events(self._peer_lost, events.abort, events.unexpected)
        self.tcp = TcpTransport(rank, inner, config.inline_send_bytes)
        self.shm: ShmTransport | None = None
        self.transports: list[Transport] = [self.tcp]
        self.route: dict[int, Transport] = {}
        self.arena: Arena | None = None
        self.cma_pids: dict[int, int] = {}  # peers whose memory we may read (pid)
        self._shared_job = False
        self._segs: list[Segment] = []
        self._slots: dict[int, memoryview] = {}
        self._small: dict[int, memoryview] = {}  # rank -> its small-message slot region
        #: rank -> its sub-groups' arena regions (one per sub-group id 1 .. group_slots - 1)
        self._garena: dict[int, memoryview] = {}
        self._group_arenas: list[Arena] = []
        self._own: Segment | None = None  # this rank's segment (it allocates its pages)
        self._garena_at = 0  # where the sub-group arenas start in it
        #: the world's small-message slots (every rank on this host, shared memory)
        self.seqslots: SeqSlots | None = None
        self.host_of: dict[int, str] = {}  # rank -> host identity (hierarchical algorithms)
        self._two_level: Link | None = None
        self._token = np.frombuffer(secrets.token_bytes(16), np.uint8).copy()

    def adopt(self, peer: int, sock: socket.socket) -> None:
        """Bootstrap callback: an authenticated connection to ``peer``."""
        self.tcp.attach(peer, sock)

    def _peer_lost(self, peer: int, reason: str, graceful: bool) -> None:
        if self.shm is not None:
            self.shm.peer_gone(peer, reason, graceful)
        self.events.peer_lost(peer, reason, graceful)

    # --- set-up -------------------------------------------------------------------------
    def finish(self, infos: dict[int, PeerInfo]) -> None:
        """Choose the transport of every peer once all connections exist."""
        me = infos.get(self.rank)
        peers = sorted(p for p in infos if p != self.rank)
        if me is None or not peers:
            return
        self.host_of = {r: info.host_id for r, info in infos.items()}
        mode = self.config.transport
        local = [p for p in peers if infos[p].host_id == me.host_id]
        if mode == "shm" and len(local) < len(peers):
            far = [p for p in peers if p not in local]
            raise UnsupportedError(
                f"UNISON_TRANSPORT=shm, but ranks {far} are on another host than rank "
                f"{self.rank}; use auto or tcp"
            )
        deadline = time.monotonic() + min(self.config.timeout, 120.0)
        shared: set[int] = set()
        if local:
            shared = self._setup_shm(local, deadline, want=mode != "tcp", forced=mode == "shm")
        for peer in peers:  # first transport that can connect wins (shm is first if set up)
            for t in self.transports:
                if (t is not self.shm or peer in shared) and t.can_connect(me, infos[peer]):
                    self.route[peer] = t
                    break
        self._agree(peers, all(self.route[p] is self.shm for p in peers), deadline)

    def _key(self, tag: int) -> Key:
        return (int(FrameKind.P2P), _FABRIC_GROUP, 0, tag)

    def _exchange(
        self,
        peers: list[int],
        tag: int,
        make: dict[int, dict[str, object]],
        deadline: float,
        op: str = "init",
    ) -> dict[int, dict[str, object]]:
        """Send ``make[peer]`` to each peer and receive theirs (fixed-size JSON, over TCP)."""
        return self._collect(self._post(peers, tag, make, deadline), deadline, op)

    def _post(
        self, peers: list[int], tag: int, make: dict[int, dict[str, object]], deadline: float
    ) -> tuple[dict[int, np.ndarray], dict[int, Request], list[Request]]:
        """Start an exchange: post the receives, then the sends (without waiting)."""
        bufs = {p: np.zeros(_MSG, np.uint8) for p in peers}
        recvs = {p: self.tcp.irecv(p, self._key(tag), bufs[p], OpSig()) for p in peers}
        sends = []
        for p in peers:
            raw = json.dumps(make[p]).encode()
            out = np.zeros(_MSG, np.uint8)
            out[: len(raw)] = np.frombuffer(raw, np.uint8)
            sends.append(self.tcp.isend(p, self._key(tag), out, OpSig(), deadline))
        return bufs, recvs, sends

    def _collect(
        self,
        posted: tuple[dict[int, np.ndarray], dict[int, Request], list[Request]],
        deadline: float,
        op: str,
    ) -> dict[int, dict[str, object]]:
        """Finish an exchange :meth:`_post` started: every peer's message."""
        bufs, recvs, sends = posted
        got: dict[int, dict[str, object]] = {}
        for p, req in list(recvs.items()) + [(-1, s) for s in sends]:
            if not req.wait(max(0.0, deadline - time.monotonic())):
                what = "the transport set-up" if op == "init" else "the shared-arena set-up"
                raise CollectiveTimeoutError(
                    f"{op}: rank {req.peer} did not answer {what} (rank {self.rank})",
                    op=op,
                    ranks=[req.peer],
                )
            if p >= 0:
                got[p] = json.loads(bufs[p].tobytes().rstrip(b"\0").decode())
        return got

    def _setup_shm(self, local: list[int], deadline: float, want: bool, forced: bool) -> set[int]:
        seg: Segment | None = None
        slot_bytes = shm_arena.SLOT_BYTES  # read at set-up: tests shrink it
        small = self.config.small_bytes
        small_off = (slot_bytes + 63) // 64 * 64  # after the arena's slot
        # small-message slot regions per rank: one for the world (group 0) and one for each of
        # the first sub-groups (ids 1 .. group_slots - 1); later groups take the general path
        small_len = region_bytes(small) * self.config.group_slots if small > 0 else 0
        # after them, the sub-groups' arenas (their rounds sync on the sub-group's slots)
        garena_off = small_off + (small_len + 63) // 64 * 64
        garena_len = self._garena_bytes() * (self.config.group_slots - 1) if small_len else 0
        layout = layout_of(local, RING_BYTES, garena_off + garena_len)
        # the sub-group arenas are mapped but not allocated: a group's members allocate
        # theirs when it is made (group_arena), so unused ones cost no /dev/shm
        self._garena_at = layout.slot_offset + garena_off
        if want:
            try:
                seg = Segment.create(
                    os.environ.get(ENV_JOB_ID, ""), self.rank, layout.size, self._garena_at
                )
                self._segs.append(seg)
                self._own = seg
            except OSError as exc:
                if forced:
                    raise UnsupportedError(f"shared memory unavailable: {exc}") from None
                log.info("no shared-memory segment (%s); using TCP", exc)
        try:
            hello: dict[str, object] = {"ok": seg is not None, "pid": os.getpid()}
            if seg is not None:
                hello.update(
                    path=seg.path,
                    size=layout.size,
                    ring=layout.rings,
                    slot=layout.slot_offset,
                    small=small_len,
                    garena=garena_len,
                    token=self._token.tobytes().hex(),
                    token_addr=self._token.ctypes.data,
                )
            theirs = self._exchange(local, _HELLO, {p: hello for p in local}, deadline)
            mapped: dict[int, Segment] = {}
            for p in local:
                h = theirs[p]
                if seg is None or not h.get("ok"):
                    continue
                try:
                    mapped[p] = Segment.attach(str(h["path"]), int(str(h["size"])))
                except (OSError, KeyError, ValueError) as exc:
                    log.warning("cannot map rank %d's segment: %s", p, exc)
                    continue
                self._segs.append(mapped[p])
                if cma.probe(
                    int(str(h["pid"])), int(str(h["token_addr"])), bytes.fromhex(str(h["token"]))
                ):
                    self.cma_pids[p] = int(str(h["pid"]))
            acks = self._exchange(local, _ACK, {p: {"ok": p in mapped} for p in local}, deadline)
        finally:
            if seg is not None:
                seg.unlink()  # every peer that will map it has done so (or failed)
        shared = {p for p in mapped if acks[p].get("ok")}
        if forced and len(shared) < len(local):
            raise UnsupportedError(
                f"UNISON_TRANSPORT=shm, but shared memory could not be set up with ranks "
                f"{sorted(set(local) - shared)}"
            )
        if not shared or seg is None:
            return set()
        self.shm = ShmTransport(self.rank, self.events, seg, len(local) + 1, self.tcp.send_control)
        self.shm.matcher.share_any_source(self.tcp.matcher)  # any-source sees every peer
        for p in sorted(shared):
            inbound = Ring(seg, layout.rings[p], RING_BYTES)
            outbound = Ring(mapped[p], ring_of_peer(theirs[p], self.rank), RING_BYTES)
            self.shm.add_peer(p, inbound, outbound, mapped[p])
        self.shm.start()
        self.transports.insert(0, self.shm)
        slots = {self.rank: seg.view(layout.slot_offset, slot_bytes)}
        for p in shared:
            slots[p] = mapped[p].view(int(str(theirs[p]["slot"])), slot_bytes)
        self._slots = slots
        if small_len and all(int(str(theirs[p].get("small", 0))) == small_len for p in shared):
            self._small = {self.rank: seg.view(layout.slot_offset + small_off, small_len)}
            for p in shared:
                off = int(str(theirs[p]["slot"])) + small_off
                self._small[p] = mapped[p].view(off, small_len)
        if garena_len and all(int(str(theirs[p].get("garena", 0))) == garena_len for p in shared):
            self._garena = {self.rank: seg.view(layout.slot_offset + garena_off, garena_len)}
            for p in shared:
                off = int(str(theirs[p]["slot"])) + garena_off
                self._garena[p] = mapped[p].view(off, garena_len)
        return shared

    def _agree(self, peers: list[int], mine: bool, deadline: float) -> None:
        """Learn whether every rank reaches all its peers by shared memory."""
        told = self._exchange(peers, _SUMMARY, {p: {"shm": mine} for p in peers}, deadline)
        self._shared_job = mine and all(bool(told[p].get("shm")) for p in peers)
        if self._shared_job:
            # one host, one cache file: every rank installs the same measured link
            from ...transport.calibrate import install

            install()
            self.arena = Arena(self.rank, self._slots, len(self._slots[self.rank]))
            small = self.config.small_bytes
            if small > 0 and len(self._small) == len(peers) + 1:
                nb = region_bytes(small)
                regions = [self._small[r][:nb] for r in range(len(peers) + 1)]
                self.seqslots = SeqSlots(self.rank, regions, small, adapt=self.config.wait_adapt)
        if log.isEnabledFor(10):  # DEBUG: the choice table every rank computes alike
            from ...algorithms.select import table

            sizes = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
            log.debug("algorithm choices:\n%s", table(len(peers) + 1, self.link(), sizes))
        log.debug(
            "routes: %s; shared-memory job: %s; cma peers: %s",
            {p: t.name for p, t in self.route.items()},
            self._shared_job,
            sorted(self.cma_pids),
        )

    def group_slots(self, gid: int, ranks: Sequence[int]) -> SeqSlots | None:
        """The small-message slots of group ``gid`` (global ``ranks``, sorted) for a
        member, or None: the same answer on every member (the job has slots, the id has
        a region), so all of them take the slots for the same calls."""
        world = self.seqslots
        small = self.config.small_bytes
        if len(ranks) == 1 and ranks[0] == self.rank and small > 0:
            # a group of one: a private region; every call is a local copy or a no-op
            return SeqSlots(0, [memoryview(bytearray(region_bytes(small)))], small)
        if world is None or self.rank not in ranks or gid >= self.config.group_slots:
            return None
        if gid == 0:
            return world
        nb = region_bytes(world.slot_bytes)
        regions = [self._small[r][gid * nb : (gid + 1) * nb] for r in ranks]
        return SeqSlots(
            list(ranks).index(self.rank),
            regions,
            world.slot_bytes,
            oversubscribed=world.policy.oversubscribed,  # the host's ranks, not the group's
            adapt=self.config.wait_adapt,
        )

    def _garena_bytes(self) -> int:
        """Bytes of one sub-group's arena per rank (0: none; too small to hold a round)."""
        n = self.config.group_arena_bytes // 64 * 64
        return n if n >= _GARENA_MIN else 0

    def group_arena(
        self, gid: int, ranks: Sequence[int]
    ) -> Callable[[float, str], Arena | None] | None:
        """Start setting up the shared arena of sub-group ``gid`` (global ``ranks``,
        sorted) for a member: None where it has none (the same answer on every member:
        the job shares one host, every rank mapped the same sub-group regions, the id has
        a slot region), else a function that gives the arena, or None, the same on every
        member: whether every member could allocate its part.

        Called by every member when the group is made: each allocates its own part of
        the group's arena in its segment (the pages are then resident nowhere until a
        round touches them) and sends the others whether that succeeded, without waiting
        (a member may make a group its peers never use: elastic joiners). The function
        is called before the group's first collective that may choose an algorithm
        (every member is then making, or has made, the group), with its deadline and the
        collective's name for errors, and waits for the peers' answers; nothing touches
        the arena unless every member's part is allocated (no SIGBUS on a short
        /dev/shm: the group takes the message-based algorithms)."""
        nb = self._garena_bytes()
        if (
            gid <= 0
            or gid >= self.config.group_slots
            or self.arena is None
            or not nb
            or self.rank not in ranks
            or any(r not in self._garena for r in ranks)
        ):
            return None
        off = (gid - 1) * nb
        ok, why = True, ""
        if self._own is not None:
            try:
                allocate(self._own, self._garena_at + off, nb, f"arena of group {gid}")
            except OSError as exc:
                ok, why = False, str(exc)
        else:
            ok, why = False, "no segment of its own"
        peers = [r for r in ranks if r != self.rank]
        deadline = time.monotonic() + self.config.timeout
        posted = self._post(peers, _GARENA_TAG + gid, {p: {"ok": ok} for p in peers}, deadline)

        def resolve(deadline: float, op: str) -> Arena | None:
            try:
                told = self._collect(posted, deadline, op)
            except ValueError:  # an empty answer: the peer was lost; the group fails
                told = {}
            lacking = sorted(
                [r for r in peers if not told.get(r, {}).get("ok")] + ([] if ok else [self.rank])
            )
            if lacking:
                log.info(
                    "group %d: no shared arena (ranks %s could not allocate theirs%s); its "
                    "large collectives take the message-based algorithms",
                    gid,
                    lacking,
                    f": {why}" if why else "",
                )
                return None
            arena = Arena(self.rank, {r: self._garena[r][off : off + nb] for r in ranks}, nb)
            self._group_arenas.append(arena)
            return arena

        return resolve

    def link(self) -> Link:
        """The cost model's link, identical on every rank (agreed in :meth:`finish`)."""
        if self._shared_job:
            return shared_link(half=shm_arena.SLOT_BYTES // 2, slots=self.seqslots is not None)
        flat = transport_link("tcp")
        if self._two_level is None and self.host_of:  # once the layout is known
            self._two_level = two_level(self.host_of, flat, self.config.transport) or flat
        return self._two_level or flat

    def _to(self, peer: int) -> Transport:
        return self.route.get(peer, self.tcp)

    # --- the Router interface used by algorithms and p2p -----------------------------
    def isend(self, peer: int, key: Key, view: np.ndarray, sig: OpSig, deadline: float) -> Request:
        return self._to(peer).isend(peer, key, view, sig, deadline)

    def irecv(self, peer: int, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        return self._to(peer).irecv(peer, key, view, sig)

    def irecv_any(self, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        """Receive the next message with ``key`` from any peer (``req.peer`` becomes the
        sender); the order guarantees are :mod:`unison.transport.matching`'s."""
        req = (
            Request(ANY_SOURCE, key, view, sig)
            if self.shm is None
            else ShmRequest(self.shm, ANY_SOURCE, key, view, sig)
        )
        msg = self.tcp.matcher.post(req)
        if msg is not None:
            self.tcp.deliver_copy(req, msg)
        return req

    def cancel(self, peer: int, req: Request) -> None:
        if req.peer == ANY_SOURCE:
            self.tcp.matcher.cancel(req)
            return
        self._to(peer).cancel(req)

    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        self.tcp.send_control(peer, ctl, payload)

    def gone(self, peers: Sequence[int]) -> PeerLostError | None:
        """Why one of ``peers`` can no longer take part (its connection closed), or None."""
        return self.tcp.gone(peers)

    def forget(self, group: int, seq: int) -> None:
        for t in self.transports:
            t.forget(group, seq)

    def close(self) -> None:
        for t in self.transports:  # shm first: its queued data goes out before GOODBYE
            t.close()
        if self.arena is not None:
            self.arena.release()
            self.arena = None
        self.seqslots = None
        self._small.clear()
        for ga in self._group_arenas:
            ga.release()
        self._group_arenas.clear()
        self._garena.clear()
        for seg in self._segs:
            seg.unlink()
            seg.close()
        self._own = None


def ring_of_peer(hello: dict[str, object], rank: int) -> int:
    rings = hello.get("ring")
    if not isinstance(rings, dict):
        raise UnsupportedError("malformed shared-memory hello (no ring table)")
    return int(rings[str(rank)])
