"""Shared-memory set-up: this rank's segment, its peers' mappings, and the regions in them.

Owns the segment layout (one ring per ordered pair of same-host ranks, the world
arena's slot, the small-message slot regions, the sub-group arenas), the hello/ack
that maps the peers' segments, the shared-memory transport built from them, and
what lives in the mappings afterwards: the world's arena and slots, each sub-group's
slots and arena. Which peer is reached by which transport is the fabric's
(``fabric.py``); this module only says which peers could be mapped.

The set-up, over the already authenticated TCP connections:

1. every rank creates its segment and sends each same-host peer a *hello*
   (segment path and layout, pid, a token for the cross-memory-attach probe);
2. each maps its peers' segments and answers with an *ack* (mapped or not);
   a pair uses shared memory only when both sides mapped — both decide alike;
3. once every ack is in, the owner unlinks its segment (the mappings live on,
   so no file outlives this point even if the rank is killed).
"""

from __future__ import annotations

import _thread
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import numpy as np

from ...algorithms import shm_arena
from ...config import ENV_JOB_ID, Config
from ...errors import CollectiveTimeoutError, UnsupportedError
from ...log import get_logger
from ...transport import cma
from ...transport.arena import Arena
from ...transport.base import Events
from ...transport.seqslot import SeqSlots, region_bytes
from ...transport.shm import ShmTransport
from ...transport.shm_ring import Ring
from ...transport.shm_segment import Layout, Segment, layout_of
from ...transport.tcp import TcpTransport
from .setup_exchange import ACK, GROUP_ARENA, HELLO, Posted, SetupExchange

__all__ = [
    "GROUP_SLOT_BYTES",
    "RING_BYTES",
    "Allocator",
    "Mapped",
    "PartAllocation",
    "ShmSetup",
    "group_slot_bytes",
    "reserve",
    "slot_regions",
]

log = get_logger("fabric")

T = TypeVar("T")

#: bytes of each shared-memory ring (one per ordered pair of same-host ranks)
RING_BYTES = 1 << 19
_GARENA_MIN = 4096  # a sub-group arena smaller than this is not worth its rounds
#: the most a sub-group's slots carry (less where ``UNISON_SMALL_BYTES`` is less): every
#: rank allocates a slot region for each of the ``UNISON_GROUP_SLOTS - 1`` sub-group ids
#: at start-up, used or not, so these stay small; a larger sub-group collective goes
#: through the group's arena, allocated only when the group is made
GROUP_SLOT_BYTES = 64 << 10

#: how a range of this rank's segment is allocated: (segment, offset, length, what,
#: needs: the bytes of the whole allocation the range is part of, for its error)
Allocator = Callable[[Segment, int, int, str, int], None]
#: an arena part is allocated this many bytes at a time: closing the runtime while a
#: group's part is still being allocated (a group made and destroyed at once) then
#: waits for one step, not for the whole part
ALLOCATION_STEP = 1 << 20


def group_slot_bytes(small: int) -> int:
    """What a sub-group's slots (and a group of one's) carry, for ``UNISON_SMALL_BYTES``."""
    return min(small, GROUP_SLOT_BYTES)


def slot_regions(small: int) -> tuple[int, int]:
    """Bytes of one rank's world slot region and of each sub-group's, for slots of
    ``small`` bytes (0, 0: no slots)."""
    if small <= 0:
        return 0, 0
    return region_bytes(small), region_bytes(group_slot_bytes(small))


@dataclass
class Mapped:
    """What :meth:`ShmSetup.connect` learnt: the peers reached by shared memory (both
    sides mapped the other's segment); whether every pair of this host's ranks mapped
    each other both ways (the same answer on every one of them: each ack lists what
    its sender mapped); and what each peer noted in its ack."""

    shared: set[int]
    every_pair: bool
    notes: dict[int, dict[str, object]]


def reserve(seg: Segment, offset: int, length: int, what: str, needs: int) -> None:
    """Allocate a range of this rank's segment (the default :data:`Allocator`)."""
    seg.reserve(offset, length, what, needs)


class Background(Generic[T]):
    """``work()`` run on a thread of its own, and what it returned or raised.

    The thread is started without ``threading.Thread.start()``, which waits until the
    new thread runs: on a host whose cores are all busy that wait is a scheduling round
    trip (milliseconds) in ``init`` or ``new_group``, for work nothing waits for there."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:  # given to whoever asks for the result
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the work ended (False: ``timeout`` passed first)."""
        return self._done.wait(timeout)

    def result(self) -> T:
        """What the work returned, once it ended; raises what it raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class PartAllocation:
    """This rank's part of a group's arena, allocated on a thread of its own: reserving
    every page up front takes milliseconds, which would otherwise be spent in ``init``
    or ``new_group``. The thread allocates (``allocate(stopping)``: "" on success, else
    why not; it ends early once ``stopping`` is set), then tells the peers
    (``tell(ok)``: the posted exchange), whatever this rank does meanwhile: a peer that
    agrees on the arena before its first large collective never waits for this rank to
    reach one. Nothing of the arena is touched before
    :meth:`result` returned and every member said yes."""

    def __init__(
        self, allocate: Callable[[threading.Event], str], tell: Callable[[bool], Posted]
    ) -> None:
        self.ok = False
        self.why = ""  # why this rank's part could not be allocated
        self._allocate, self._tell = allocate, tell
        #: set by :meth:`stop`; ``allocate`` checks it between steps
        self._stopping = threading.Event()
        self._thread = Background(self._run)

    def _run(self) -> Posted:
        self.why = self._allocate(self._stopping)
        self.ok = not self.why
        return self._tell(self.ok)  # raises where the transport closed under it

    def result(self, deadline: float, op: str) -> Posted:
        """The exchange with the peers, once this rank's part is allocated (or not) and
        its answer sent; raises what the thread met, or a timeout at ``deadline``."""
        if not self._thread.wait(max(0.0, deadline - time.monotonic())):
            raise CollectiveTimeoutError(
                f"{op}: this rank's part of the group's shared arena was not allocated in time",
                op=op,
            )
        return self._thread.result()

    def join(self) -> None:
        """Wait for the thread (it runs for milliseconds)."""
        self._thread.wait()

    def stop(self) -> None:
        """Leave the rest of the part unallocated (the runtime closes), and wait for the
        step in progress."""
        self._stopping.set()
        self._thread.wait()


@dataclass(frozen=True)
class _Plan:
    """Where a rank's segment holds what: the rings (``layout``), then at its slot offset
    the world arena's slot, the small-message slot regions and the sub-group arenas."""

    layout: Layout
    slot_bytes: int
    small_off: int
    small_len: int
    garena_off: int
    garena_len: int

    def create(self, rank: int) -> Segment:
        """This rank's segment, with the rings and the small-message slots allocated (the
        world arena's slot and the sub-group arenas are allocated when their group is
        made: unused ones cost no /dev/shm)."""
        at = self.layout.slot_offset
        now = [(0, at), (at + self.small_off, self.small_len)]
        return Segment.create(os.environ.get(ENV_JOB_ID, ""), rank, self.layout.size, now)


class _EarlySegment:
    """A segment being created on a thread of its own (:meth:`ShmSetup.prepare`)."""

    def __init__(self, plan: _Plan, rank: int) -> None:
        self.plan = plan
        self._made = Background(partial(plan.create, rank))

    def take(self) -> Segment:
        """The segment, once created (raises the ``OSError`` that prevented it)."""
        return self._made.result()

    def discard(self) -> None:
        """Remove the segment, once created (nothing maps it yet)."""
        try:
            seg = self._made.result()
        except Exception:  # none was made (connect() says why where it wants one)
            return
        seg.unlink()
        seg.close()


class ShmSetup:
    """This rank's shared memory with its same-host peers."""

    def __init__(
        self, rank: int, config: Config, events: Events, tcp: TcpTransport, messages: SetupExchange
    ) -> None:
        self.rank = rank
        self.config = config
        self.events = events
        self.tcp = tcp
        self.messages = messages
        #: the shared-memory transport, once a peer's segment is mapped both ways
        self.transport: ShmTransport | None = None
        self.cma_pids: dict[int, int] = {}  # peers whose memory we may read (pid)
        #: the world's arena (every rank on this host): given by :meth:`group_arena` of
        #: group 0 once every rank allocated its slot; the world's small-message slots: set
        #: by :meth:`share_world` once every rank reaches every peer by shared memory
        self.arena: Arena | None = None
        self._world_shared = False  # share_world() ran
        self._world_at = self._world_nb = 0  # this rank's world arena slot in its segment
        self.seqslots: SeqSlots | None = None
        self._allocate: Allocator = reserve
        self._segs: list[Segment] = []
        self._slots: dict[int, memoryview] = {}
        self._small: dict[int, memoryview] = {}  # rank -> its small-message slot region
        #: rank -> its sub-groups' arena regions (one per sub-group id 1 .. group_slots - 1)
        self._garena: dict[int, memoryview] = {}
        self._group_arenas: list[Arena] = []
        self._allocations: list[PartAllocation] = []  # sub-group arena parts (threads)
        self._own: Segment | None = None  # this rank's segment (it allocates its pages)
        self._garena_at = 0  # where the sub-group arenas start in it
        self._token = np.frombuffer(secrets.token_bytes(16), np.uint8).copy()
        self._early: _EarlySegment | None = None  # the segment prepare() is creating

    @property
    def segment(self) -> Segment | None:
        """This rank's own segment (None: it has none)."""
        return self._own

    @property
    def world_part(self) -> int:
        """Bytes at the start of this rank's segment allocated at set-up: the rings and
        the small-message slots at once, the world arena's slot on a thread as the world
        is made; the sub-group arenas follow, allocated when a group is made."""
        return self._garena_at

    def set_allocator(self, allocate: Allocator) -> None:
        """Allocate this rank's part of later sub-group arenas with ``allocate`` (an
        :data:`Allocator` that raises ``OSError`` where there is no room)."""
        self._allocate = allocate

    def _plan(self, local: list[int]) -> _Plan:
        """Where this rank's segment for the same-host peers ``local`` holds what."""
        slot_bytes = shm_arena.SLOT_BYTES  # read at set-up: tests shrink it
        small = self.config.small_bytes
        small_off = (slot_bytes + 63) // 64 * 64  # after the arena's slot
        # small-message slot regions per rank: one for the world (group 0) and a smaller one
        # for each of the first sub-groups (ids 1 .. group_slots - 1); later groups take the
        # general path
        world_nb, group_nb = slot_regions(small)
        small_len = world_nb + group_nb * (self.config.group_slots - 1)
        # after them, the sub-groups' arenas (their rounds sync on the sub-group's slots)
        garena_off = small_off + (small_len + 63) // 64 * 64
        garena_len = self._garena_bytes() * (self.config.group_slots - 1) if small_len else 0
        layout = layout_of(local, RING_BYTES, garena_off + garena_len)
        return _Plan(layout, slot_bytes, small_off, small_len, garena_off, garena_len)

    def prepare(self, local: list[int]) -> None:
        """Start creating this rank's segment for the same-host peers ``local`` that the
        job's launcher announced, on a thread of its own: allocating its pages takes about
        a millisecond, which the rendezvous and the mesh, mostly waiting on round trips,
        then hide. :meth:`connect` takes it where the mesh found those peers on this
        host, and discards it otherwise."""
        if self._early is None and local:
            self._early = _EarlySegment(self._plan(local), self.rank)

    def connect(
        self,
        local: list[int],
        deadline: float,
        want: bool,
        forced: bool,
        note: dict[str, object],
    ) -> Mapped:
        """Set up shared memory with the same-host peers ``local``: which peers both
        sides mapped (:attr:`transport` then reaches them), whether every pair of these
        ranks did, and what each peer noted. ``want``: make a segment at all;
        ``forced``: every peer must be mapped; ``note``: what this rank tells every peer
        in its ack (the fabric's summary: it needs no exchange of its own)."""
        plan = self._plan(local)
        at = plan.layout.slot_offset
        self._garena_at = at + plan.garena_off
        self._world_at, self._world_nb = at, plan.slot_bytes
        seg = self._own_segment(plan, want, forced)
        try:
            hello: dict[str, object] = {"ok": seg is not None, "pid": os.getpid()}
            if seg is not None:
                hello.update(
                    path=seg.path,
                    size=plan.layout.size,
                    ring=plan.layout.rings,
                    slot=at,
                    small=plan.small_len,
                    garena=plan.garena_len,
                    token=self._token.tobytes().hex(),
                    token_addr=self._token.ctypes.data,
                )
            theirs = self.messages.exchange(local, HELLO, {p: hello for p in local}, deadline)
            mapped = self._map_peers(local, theirs) if seg is not None else {}
            ack = {"mapped": sorted(mapped), **note}
            acks = self.messages.exchange(
                local, ACK, {p: {"ok": p in mapped, **ack} for p in local}, deadline
            )
        finally:
            if seg is not None:
                seg.unlink()  # every peer that will map it has done so (or failed)
        shared = {p for p in mapped if acks[p].get("ok")}
        notes = {p: {k: acks[p].get(k) for k in note} for p in local}
        if forced and len(shared) < len(local):
            raise UnsupportedError(
                f"UNISON_TRANSPORT=shm, but shared memory could not be set up with ranks "
                f"{sorted(set(local) - shared)}"
            )
        if not shared or seg is None:
            return Mapped(set(), False, notes)
        ranks = {self.rank, *local}
        every_pair = len(mapped) == len(local) and all(
            _listed(acks[p].get("mapped")) >= ranks - {p} for p in local
        )
        shm = ShmTransport(self.rank, self.events, seg, len(local) + 1, self.tcp.send_control)
        self.transport = shm  # from now on a lost peer is reported to it too
        shm.matcher.share_any_source(self.tcp.matcher)  # any-source sees every peer
        for p in sorted(shared):
            inbound = Ring(seg, plan.layout.rings[p], RING_BYTES)
            outbound = Ring(mapped[p], ring_of_peer(theirs[p], self.rank), RING_BYTES)
            shm.add_peer(p, inbound, outbound, mapped[p])
        shm.start()
        peers = {p: (mapped[p], int(str(theirs[p]["slot"]))) for p in shared}
        self._slots = _region_views(self.rank, (seg, at), peers, 0, plan.slot_bytes)
        if _agreed(theirs, shared, "small", plan.small_len):
            self._small = _region_views(self.rank, (seg, at), peers, plan.small_off, plan.small_len)
        if _agreed(theirs, shared, "garena", plan.garena_len):
            self._garena = _region_views(
                self.rank, (seg, at), peers, plan.garena_off, plan.garena_len
            )
        return Mapped(shared, every_pair, notes)

    def _own_segment(self, plan: _Plan, want: bool, forced: bool) -> Segment | None:
        """This rank's segment: the one made early if it fits ``plan``, else a new one
        (None: none wanted, or none could be made and shared memory is not ``forced``)."""
        early, self._early = self._early, None
        if early is not None and (not want or early.plan != plan):
            early.discard()  # made for another set of peers (or none is wanted)
            early = None
        if not want:
            return None
        try:
            seg = early.take() if early is not None else plan.create(self.rank)
        except OSError as exc:
            if forced:
                raise UnsupportedError(f"shared memory unavailable: {exc}") from None
            log.info("no shared-memory segment (%s); using TCP", exc)
            return None
        self._segs.append(seg)
        self._own = seg
        return seg

    def _map_peers(
        self, local: list[int], theirs: dict[int, dict[str, object]]
    ) -> dict[int, Segment]:
        """Map the segment of every peer whose hello offers one, and note the peers whose
        memory this process can also read directly (CMA)."""
        mapped: dict[int, Segment] = {}
        for p in local:
            h = theirs[p]
            if not h.get("ok"):
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
        return mapped

    def share_world(self, size: int) -> None:
        """Every one of the ``size`` ranks reaches every other by shared memory (the
        fabric agreed it): make the world's arena and, where every rank mapped the
        small-message regions, the world's slots. The world's arena follows once the
        world is made (:meth:`group_arena` of group 0)."""
        self._world_shared = True
        small = self.config.small_bytes
        if small > 0 and len(self._small) == size:
            nb, _ = slot_regions(small)
            regions = [self._small[r][:nb] for r in range(size)]
            self.seqslots = SeqSlots(self.rank, regions, small, adapt=self.config.wait_adapt)

    def group_slots(self, gid: int, ranks: Sequence[int]) -> SeqSlots | None:
        """The small-message slots of group ``gid`` (global ``ranks``, sorted) for a
        member, or None: the same answer on every member (the job has slots, the id has
        a region), so all of them take the slots for the same calls."""
        world = self.seqslots
        small = self.config.small_bytes
        if len(ranks) == 1 and ranks[0] == self.rank and small > 0:
            # a group of one: a private region; every call is a local copy or a no-op
            one = group_slot_bytes(small)
            return SeqSlots(0, [memoryview(bytearray(region_bytes(one)))], one)
        if world is None or self.rank not in ranks or gid >= self.config.group_slots:
            return None
        if gid == 0:
            return world
        world_nb, nb = slot_regions(small)
        at = world_nb + (gid - 1) * nb
        regions = [self._small[r][at : at + nb] for r in ranks]
        return SeqSlots(
            list(ranks).index(self.rank),
            regions,
            group_slot_bytes(small),
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
        """Start setting up the shared arena of group ``gid`` (global ``ranks``, sorted)
        for a member: None where it has none (the same answer on every member: the job
        shares one host and, for a sub-group, every rank mapped the same sub-group
        regions and the id has a slot region), else a function that gives the arena, or
        None, the same on every member: whether every member could allocate its part.
        The world (``gid`` 0) has every rank's slot, the sub-groups a part of the
        sub-group regions.

        Called by every member when the group is made (the world in ``init``): each
        allocates its own part of the group's arena in its segment (the pages are then
        resident nowhere until a round touches them) and sends the others whether that
        succeeded, on a thread of its own (:class:`PartAllocation`: the group is made
        without waiting for the pages, which take milliseconds, nor for the peers: a
        member may make a group its peers never use, e.g. elastic joiners). The function
        is called before the group's first collective that may choose an algorithm
        (every member is then making, or has made, the group), with its deadline and the
        collective's name for errors, and waits for the peers' answers; nothing touches
        the arena unless every member's part is allocated (no SIGBUS on a short
        /dev/shm: the group takes the message-based algorithms)."""
        if not self._world_shared or self.rank not in ranks:
            return None
        if gid == 0:  # the world's: every rank's slot
            nb, own_at, regions = self._world_nb, self._world_at, self._slots
        else:
            nb = self._garena_bytes()
            if (
                gid < 0
                or gid >= self.config.group_slots
                or not nb
                or any(r not in self._garena for r in ranks)
            ):
                return None
            off = (gid - 1) * nb
            own_at = self._garena_at + off
            regions = {r: self._garena[r][off : off + nb] for r in ranks}
        own = self._own
        peers = [r for r in ranks if r != self.rank]
        what = "world's arena" if gid == 0 else f"arena of group {gid}"
        post_by = time.monotonic() + self.config.timeout

        reserve_part = self._allocate  # the allocator of when the group is made

        def allocate(stopping: threading.Event) -> str:
            if own is None:
                return "no segment of its own"
            try:
                for at in range(0, nb, ALLOCATION_STEP):
                    if stopping.is_set():
                        return "closed before it was allocated"
                    reserve_part(own, own_at + at, min(ALLOCATION_STEP, nb - at), what, nb)
            except OSError as exc:
                return str(exc)
            return ""

        def tell(ok: bool) -> Posted:
            return self.messages.post(
                peers, GROUP_ARENA + gid, {p: {"ok": ok} for p in peers}, post_by
            )

        part = PartAllocation(allocate, tell)
        self._allocations.append(part)

        def resolve(deadline: float, op: str) -> Arena | None:
            posted = part.result(deadline, op)
            try:
                told = self.messages.collect(posted, deadline, op)
            except ValueError:  # an empty answer: the peer was lost; the group fails
                told = {}
            lacking = sorted(
                [r for r in peers if not told.get(r, {}).get("ok")]
                + ([] if part.ok else [self.rank])
            )
            if lacking:
                log.info(
                    "%s: no shared arena (ranks %s could not allocate theirs%s); its "
                    "large collectives take the message-based algorithms",
                    "the world" if gid == 0 else f"group {gid}",
                    lacking,
                    f": {part.why}" if part.why else "",
                )
                return None
            arena = Arena(self.rank, regions, nb)
            if gid == 0:
                self.arena = arena
            else:
                self._group_arenas.append(arena)
            return arena

        return resolve

    def finish_allocations(self) -> None:
        """Wait for the arena allocations still running."""
        for part in self._allocations:
            part.join()
        self._allocations.clear()

    def stop_allocations(self) -> None:
        """End the arena allocations still running after their current step (before the
        transports and the segment's file close under them): nothing will use them."""
        for part in self._allocations:
            part.stop()
        self._allocations.clear()

    def close(self) -> None:
        """Release the arenas and unmap every segment (after the transports closed)."""
        self.stop_allocations()
        early, self._early = self._early, None
        if early is not None:  # start-up failed before the shared memory was set up
            early.discard()
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


def _region_views(
    rank: int, own: tuple[Segment, int], peers: dict[int, tuple[Segment, int]], off: int, nb: int
) -> dict[int, memoryview]:
    """Rank -> the ``nb`` bytes at ``off`` past its slot offset: for this ``rank`` in
    its ``own`` segment, and for each peer in its segment as mapped here (each with the
    segment's slot offset)."""
    views = {rank: own[0].view(own[1] + off, nb)}
    for p, (seg, at) in peers.items():
        views[p] = seg.view(at + off, nb)
    return views


def _agreed(theirs: dict[int, dict[str, object]], shared: set[int], key: str, nb: int) -> bool:
    """Whether this rank has a region ``key`` of ``nb`` bytes and every shared peer's
    hello announced one of the same size."""
    return bool(nb) and all(int(str(theirs[p].get(key, 0))) == nb for p in shared)


def _listed(ranks: object) -> set[int]:
    """The ranks an ack lists (none where it lists none)."""
    return {int(r) for r in ranks} if isinstance(ranks, list) else set()


def ring_of_peer(hello: dict[str, object], rank: int) -> int:
    rings = hello.get("ring")
    if not isinstance(rings, dict):
        raise UnsupportedError("malformed shared-memory hello (no ring table)")
    return int(rings[str(rank)])
