"""The fabric: every transport of this rank, and which one reaches each peer.

Owns the routing: bootstrap hands each authenticated TCP connection to the fabric;
:meth:`Fabric.finish` then decides, per peer, which transport carries data — the
first whose ``can_connect`` accepts, in preference order (shared memory before TCP
on one host, as NCCL picks the first transport that can connect).
``UNISON_TRANSPORT`` forces one. The communicator talks to the fabric only (it is
the algorithms' ``Router``), never to a transport directly; the fabric also owns
the link model every rank agrees on.

Shared memory is set up by :class:`~.shm_setup.ShmSetup` (segments, hello/ack, the
arenas and slots in them), over the already authenticated TCP connections. Each ack
also lists the peers its sender mapped and the link model it read, so every rank of a
one-host job learns, without another exchange, whether every pair shares memory and
whether all read the same model: the link model — and so every algorithm choice — is
identical on all ranks.

TCP stays connected to every peer: control frames and liveness (a dead rank is
noticed by its socket closing) go that way whatever carries the data.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..._types import OpSig
from ...algorithms import shm_arena
from ...config import Config
from ...errors import PeerLostError, UnsupportedError
from ...link import Link, shared_link, transport_link, two_level
from ...log import get_logger
from ...transport import calibrate
from ...transport.arena import Arena
from ...transport.base import Events, Key, PeerInfo, Transport
from ...transport.matching import ANY_SOURCE
from ...transport.request import Request
from ...transport.seqslot import SeqSlots
from ...transport.shm import ShmRequest, ShmTransport
from ...transport.tcp import TcpTransport
from .setup_exchange import SetupExchange
from .shm_setup import Mapped, ShmSetup

if TYPE_CHECKING:
    from ...transport.calibrate import Calibration

__all__ = ["Fabric"]

log = get_logger("fabric")


class Fabric:
    def __init__(self, rank: int, events: Events, config: Config) -> None:
        self.rank = rank
        self.config = config
        self.events = events
        inner = Events(self._peer_lost, events.abort, events.unexpected)
        self.tcp = TcpTransport(rank, inner, config.inline_send_bytes)
        self.messages = SetupExchange(rank, self.tcp)
        #: shared memory with this host's ranks (its segments, arenas and slots)
        self.shm_setup = ShmSetup(rank, config, events, self.tcp, self.messages)
        self.transports: list[Transport] = [self.tcp]
        self.route: dict[int, Transport] = {}
        self._shared_job = False
        self.host_of: dict[int, str] = {}  # rank -> host identity (hierarchical algorithms)
        self._two_level: Link | None = None

    @property
    def shm(self) -> ShmTransport | None:
        """The shared-memory transport (None: no peer's segment was mapped both ways)."""
        return self.shm_setup.transport

    @property
    def arena(self) -> Arena | None:
        """The world's shared arena (a one-host job whose ranks all share memory)."""
        return self.shm_setup.arena

    @property
    def seqslots(self) -> SeqSlots | None:
        """The world's small-message slots (every rank on this host, shared memory)."""
        return self.shm_setup.seqslots

    def adopt(self, peer: int, sock: socket.socket) -> None:
        """Bootstrap callback: an authenticated connection to ``peer``."""
        self.tcp.attach(peer, sock)

    def _peer_lost(self, peer: int, reason: str, graceful: bool) -> None:
        if self.shm is not None:
            self.shm.peer_gone(peer, reason, graceful)
        self.events.peer_lost(peer, reason, graceful)

    # --- set-up -------------------------------------------------------------------------
    @property
    def wants_shm(self) -> bool:
        """Whether same-host peers are reached by shared memory (not with TCP forced)."""
        return self.config.transport != "tcp"

    def prepare(self, size: int, local_size: int | None) -> None:
        """Before the mesh: where the launcher says all ``size`` ranks run on this host
        (``local_size``), start making this rank's segment for all of them
        (:meth:`ShmSetup.prepare`); :meth:`finish` takes it if the mesh agrees."""
        if local_size == size and size > 1 and self.wants_shm:
            self.shm_setup.prepare([r for r in range(size) if r != self.rank])

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
        one_host = len(local) == len(peers) and self.wants_shm
        # only a job whose ranks all share memory uses the host's model: others read nothing
        cal = calibrate.load() if one_host else None  # never measures: the cache, else typical
        summary: dict[str, object] = {"model": cal.digest() if cal is not None else None}
        mapped = Mapped(set(), False, {})
        if local:
            mapped = self.shm_setup.connect(
                local, deadline, want=self.wants_shm, forced=mode == "shm", note=summary
            )
            if self.shm is not None:
                self.transports.insert(0, self.shm)
        for peer in peers:  # first transport that can connect wins (shm is first if set up)
            for t in self.transports:
                if (t is not self.shm or peer in mapped.shared) and t.can_connect(me, infos[peer]):
                    self.route[peer] = t
                    break
        # every rank reaches all its peers by shared memory exactly when the job is on one
        # host and every pair of ranks mapped each other (the same answer on every rank)
        self._shared_job = one_host and mapped.every_pair
        self._install_model(peers, cal, summary, mapped.notes)

    def _install_model(
        self,
        peers: list[int],
        cal: Calibration | None,
        mine: dict[str, object],
        told: dict[int, dict[str, object]],
    ) -> None:
        """Install the link model of a job whose ranks all share memory: the host's
        cached calibration ``cal`` where every rank read the same (``told``: what each
        peer noted at set-up, ``mine``: this rank's note)."""
        if self._shared_job:
            assert cal is not None
            # one host, one cache file: every rank installs the same link, unless a
            # calibration replaced the file between two ranks' reads or their knobs
            # differ (then all take the typical figures without knobs: the same everywhere)
            if any(told[p].get("model") != mine["model"] for p in peers):
                log.info(
                    "ranks read different link models (a calibration ran meanwhile, or "
                    "UNISON_* link knobs differ between ranks); using the typical figures"
                )
                cal = calibrate.typical({})
            calibrate.install(cal=cal)
            self.shm_setup.share_world(len(peers) + 1)
        if log.isEnabledFor(10):  # DEBUG: the choice table every rank computes alike
            from ...algorithms.select import table

            sizes = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
            log.debug("algorithm choices:\n%s", table(len(peers) + 1, self.link(), sizes))
        log.debug(
            "routes: %s; shared-memory job: %s; cma peers: %s",
            {p: t.name for p, t in self.route.items()},
            self._shared_job,
            sorted(self.shm_setup.cma_pids),
        )

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

    def wait(self, req: Request, timeout: float) -> bool:
        """Wait for ``req`` at most ``timeout`` seconds, through its peer's transport."""
        if req.peer == ANY_SOURCE:
            self.tcp.wake_readers()
            return req.wait(timeout)
        return self._to(req.peer).wait(req, timeout)

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

    def explain(self, err: PeerLostError, peers: Sequence[int]) -> PeerLostError:
        """``err``, or the loss among ``peers`` that explains a peer's orderly shutdown
        (every transport's peers are the TCP mesh's: its connections say who left how)."""
        return self.tcp.explain(err, peers)

    def forget(self, group: int, seq: int) -> None:
        for t in self.transports:
            t.forget(group, seq)

    def close(self) -> None:
        self.shm_setup.stop_allocations()  # their answers go out before the transports close
        for t in self.transports:  # shm first: its queued data goes out before GOODBYE
            t.close()
        self.shm_setup.close()
