"""The native engine's runtime: job identity, store, transports, groups.

:meth:`Runtime.start` connects to the rendezvous store, exchanges addresses once,
connects every pair of ranks, and creates the world group; :meth:`Runtime.close`
undoes all of it. :mod:`unison.world` creates one (``init``) and owns it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..._types import OpSig
from ...algorithms import Choice, Topology, choose
from ...bootstrap import advertise_address, connect_mesh
from ...comm.backend import CallerThread
from ...comm.group import Group, check_members
from ...config import Config
from ...elastic.rendezvous import epoch_of
from ...errors import (
    AbortedError,
    CommunicationError,
    InvalidArgumentError,
    MismatchError,
    PeerLostError,
)
from ...jobenv import FAILURE_KEY, JobInfo, failure_record
from ...link import SharedLink
from ...log import get_logger
from ...store import FileStore, Store, TCPStore, TCPStoreServer
from ...transport.arena import Arena
from ...transport.base import Events, Key, PeerInfo
from .backend import NativeBackend
from .executor import Executor
from .fabric import Fabric
from .slot_collectives import arena_sync

__all__ = ["Runtime"]

log = get_logger("runtime")


def _layout(infos: dict[int, PeerInfo], rank: int) -> tuple[int, int, int, int]:
    """(local_rank, local_size, cross_rank, cross_size) from the hosts ranks reported."""
    hosts: list[str] = []
    for r in sorted(infos):
        if infos[r].host_id not in hosts:
            hosts.append(infos[r].host_id)
    mine = infos[rank].host_id
    local = sorted(r for r in infos if infos[r].host_id == mine)
    return local.index(rank), len(local), hosts.index(mine), len(hosts)


class Runtime:
    """The job on unison's own engine: its identity, store, fabric and groups."""

    def __init__(self, job: JobInfo, config: Config) -> None:
        self.backend = NativeBackend(self)
        self.job = job
        self.config = config
        self.rank = job.rank
        self.size = job.size
        self.server: TCPStoreServer | None = None
        self.store: Store | None = None
        events = Events(self._on_peer_lost, self._on_abort, self._on_unexpected)
        self.fabric = Fabric(job.rank, events, config)
        self.link = self.fabric.link()
        self.overrides = config.algo_overrides()
        #: every group's executor, by group id (members and non-members alike)
        self.executors: dict[int, Executor] = {}
        #: what a rank said it was blocked in when it timed out: rank -> (group, seq, text)
        self.stuck: dict[int, tuple[int, int, str]] = {}
        #: called before every collective (fault injection in tests); None normally
        self.op_hook: Callable[[Group, int, Any], None] | None = None
        self._next_gid = 1
        self._lock = threading.Lock()
        self._making = threading.Lock()  # one group made at a time (see group())
        self._settling = threading.Lock()
        #: groups whose arena is still to be agreed (see _settle_arena)
        self._arena_pending: dict[int, Callable[[float, str], Arena | None]] = {}
        #: aborts that named a group this rank has not registered yet (a faster peer
        #: failed and said so before this rank finished start-up): gid -> (peer, info)
        self._parked: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        self.infos: dict[int, PeerInfo] = {}
        self.local_rank, self.local_size, self.cross_rank, self.cross_size = 0, 1, 0, 1
        self.epoch = 0

    # --- start-up -------------------------------------------------------------------------
    def start(self) -> None:
        job, cfg = self.job, self.config
        if self.size > 1:
            # this rank's shared memory is made while the rendezvous and the mesh wait on
            # round trips, where the launcher says every rank runs on this host
            self.fabric.prepare(self.size, job.local_size)
            self.store = self._open_store()
            # an elastic round is its own rendezvous (ranks change between rounds)
            self.epoch = (
                epoch_of(cfg.elastic_round)
                if cfg.elastic_round >= 0
                else self.store.add(f"unison/epoch/{self.rank}", 1)
            )
            host = job.store_addr[0] if job.store_addr else None
            self.infos = connect_mesh(
                self.store,
                self.rank,
                self.size,
                job.secret or b"",
                job.job_id,
                advertise=advertise_address(host, cfg.network_interface),
                bind=cfg.bind_addr,
                timeout=cfg.timeout,
                epoch=self.epoch,
                adopt=self.fabric.adopt,
            )
            self.fabric.finish(self.infos)
            self.link = self.fabric.link()
            self.local_rank, self.local_size, self.cross_rank, self.cross_size = _layout(
                self.infos, self.rank
            )
        if job.local_rank is not None and job.local_size is not None:
            self.local_rank, self.local_size = job.local_rank, job.local_size
        if job.cross_rank is not None and job.cross_size is not None:
            self.cross_rank, self.cross_size = job.cross_rank, job.cross_size
        if cfg.faults:
            from ...testing.faults import install

            install(self, cfg.faults)
        self.world = self.group(0, range(self.size))

    def _open_store(self) -> Store:
        job, cfg = self.job, self.config
        if job.store_addr is not None:
            host, port = job.store_addr
            if job.host_store:
                self.server = TCPStoreServer("0.0.0.0", port, job.secret).start()
            # the epoch's add, the first request, proves the secret (no ping of its own)
            return TCPStore(host, port, job.secret, timeout=cfg.timeout, verify=False)
        if job.store_path:
            return FileStore(job.store_path, timeout=cfg.timeout)
        raise InvalidArgumentError(
            f"rank {self.rank} of {self.size}: no rendezvous store address; start the job with "
            "`unison run`, or set UNISON_STORE_ADDR / MASTER_ADDR+MASTER_PORT"
        )

    # --- routing: the fabric is the algorithms' Router ------------------------------------
    @property
    def router(self) -> Fabric:
        return self.fabric

    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        self.fabric.send_control(peer, ctl, payload)

    def forget(self, group: int, seq: int) -> None:
        self.fabric.forget(group, seq)

    def choose(self, coll: str, p: int, nbytes: int, group: Group | None = None) -> Choice:
        """The algorithm for ``coll`` on ``group`` (default: the world) of ``p`` ranks."""
        gid = 0 if group is None else group.id
        if self._arena_pending and gid in self._arena_pending:
            self._settle_arena(gid, coll)
        return choose(coll, p, nbytes, self.executors[gid].topo, self.overrides)

    def _settle_arena(self, gid: int, coll: str) -> None:
        """Before a group's first collective that chooses an algorithm (in the same place
        on every member): learn whether every member allocated its part of the group's
        arena (:meth:`ShmSetup.group_arena`) and, if so, give the group the arena."""
        with self._settling:
            resolve = self._arena_pending.pop(gid, None)
            if resolve is None:
                return
            arena = resolve(time.monotonic() + self.config.timeout, coll)
            if arena is None:
                return
            ex = self.executors[gid]
            link = ex.topo.link
            if gid != 0 and isinstance(link, SharedLink):
                # the cost model's rounds are the arena's (the world's link has them already)
                link = replace(link, half=arena.half)
            if ex.slots is not None:
                ex.round_barrier = arena_sync(self, ex.slots)  # rounds sync on its slots
            ex.topo = replace(ex.topo, link=link, shared=True, arena=arena)

    def _topology(self, gid: int, ranks: Sequence[int], own_arena: bool = True) -> Topology:
        """A group's topology, identical on every rank (from what the fabric agreed).

        The world and the sub-groups with a slot region (``UNISON_GROUP_SLOTS``) get a
        shared arena on one host (the world's of ``SLOT_BYTES`` per rank; a sub-group's
        own, ``UNISON_GROUP_ARENA_BYTES`` per rank, its rounds in its ``half``): their
        operations run one at a time, in the same order on every member, so the direct
        shared-memory algorithms apply. The arena is allocated on a thread as the group is
        made and agreed before the group's first chosen algorithm (:meth:`choose`):
        until then the topology has none (``own_arena=False``: a sub-group that never
        gets one)."""
        host_of = self.fabric.host_of
        by_host: dict[str, list[int]] = {}
        for g, r in enumerate(ranks):
            by_host.setdefault(host_of.get(r, ""), []).append(g)
        hosts = tuple(tuple(h) for h in by_host.values())
        if own_arena:  # the group's arena: settled before its first chosen algorithm
            resolve = self.fabric.shm_setup.group_arena(gid, ranks)
            if resolve is not None:
                self._arena_pending[gid] = resolve
        return Topology(self.link, hosts=hosts)

    # --- groups -------------------------------------------------------------------------------
    @property
    def groups(self) -> dict[int, Group]:
        """Every group of this runtime, by id."""
        return {gid: ex.group for gid, ex in list(self.executors.items())}

    def new_group(
        self, ranks: Sequence[int] | None, *, timeout: float | None = None, arena: bool = True
    ) -> Group:
        """A new sub-group (every rank calls it, in the same order). ``timeout``: its
        operations' deadline (None: the job's). ``arena=False``: it never gets a shared
        arena, for a group whose collectives are all small (the Horovod API's negotiation
        group): no /dev/shm reserved for it."""
        members = check_members(ranks, self.size)
        with self._lock:
            gid = self._next_gid
            self._next_gid += 1
        return self.group(gid, members, arena=arena, timeout=timeout)

    def group(
        self,
        gid: int,
        members: Sequence[int],
        *,
        arena: bool = True,
        timeout: float | None = None,
    ) -> Group:
        """The group ``gid`` of global ``members`` (sorted), made with its executor on
        first use; every rank that uses it passes the same id and members. The members
        of a sub-group with an arena allocate their part of it here and tell each other
        (:meth:`ShmSetup.group_arena`); they agree before its first chosen algorithm."""
        with self._lock:
            ex = self.executors.get(gid)
            if ex is not None:
                return ex.group
        with self._making:  # a sub-group's arena is agreed with its members: not under _lock
            return self._make_group(gid, members, arena, timeout)

    def _make_group(
        self, gid: int, members: Sequence[int], arena: bool, timeout: float | None
    ) -> Group:
        with self._lock:
            ex = self.executors.get(gid)
            if ex is not None:
                return ex.group
        topo = self._topology(gid, members, arena)
        with self._lock:
            cfg = self.config if timeout is None else self.config.replace(timeout=timeout)
            g = Group(gid, members, self.rank, cfg, self.backend)
            ex = Executor(self, g, topo)
            ex.slots = self.fabric.shm_setup.group_slots(gid, g.ranks)
            if topo.arena is not None and ex.slots is not None:  # rounds sync on the slots
                ex.round_barrier = arena_sync(self, ex.slots)
            if not self.overrides and g.size > 1:
                # forced algorithms run at every size: no slots for them (slot_collectives.py);
                # a group without slots runs its small all-reduces there (message_calls.py)
                g.caller_thread = CallerThread(ex, every_collective=ex.slots is not None)
            # reachable by transport events from now on; deliver aborts that came early
            self.executors[gid] = ex
            parked = self._parked.pop(gid, [])
        for peer, info in parked:
            self._on_abort(peer, info)
        return g

    # --- events from the transport's threads ----------------------------------------------------
    def _on_peer_lost(self, peer: int, reason: str, graceful: bool) -> None:
        if graceful:
            # An orderly goodbye: the peer finished everything it was part of. Receives
            # still posted for it have already failed in the transport; nothing else did.
            return
        what = f"was lost ({reason})"
        for ex in list(self.executors.values()):
            if peer in ex.ranks and ex.group.rank is not None:
                ex.peer_lost(PeerLostError(f"rank {peer} {what}", ranks=(peer,), group=ex.id))

    def _on_unexpected(self, peer: int, key: Key, sig: OpSig) -> None:
        ex = self.executors.get(key[1])
        if ex is not None:
            ex.foreign_frame(key[2], peer, sig)

    def _on_abort(self, peer: int, info: dict[str, Any]) -> None:
        try:
            gid = int(str(info.get("group", -1)))
            seq = int(str(info.get("seq", 0)))
            origin = int(str(info.get("origin", peer)))
        except (TypeError, ValueError):
            return
        with self._lock:
            ex = self.executors.get(gid)
            if ex is None:  # not registered yet: deliver when it is
                self._parked.setdefault(gid, []).append((peer, info))
                return
        if info.get("kind") == "timeout-notice":
            self.stuck[origin] = (gid, seq, str(info.get("doing", "?")))
            waiting = info.get("waiting")
            ex.timeout_notice(seq, origin, list(waiting) if isinstance(waiting, list) else [])
            return
        text = str(info.get("message", "unknown failure"))
        exc: CommunicationError
        lost = info.get("lost")
        if info.get("kind") == "peer-lost" and isinstance(lost, list):
            exc = PeerLostError(
                f"{text} (as rank {origin} saw it)",
                group=gid,
                ranks=tuple(int(r) for r in lost if isinstance(r, int)),
                remote=True,
            )
        elif info.get("kind") == "mismatch":
            op = info.get("op")
            exc = MismatchError(
                text,
                op=op if isinstance(op, str) else None,
                group=gid,
                ranks=(origin,),
                remote=True,
            )
        else:
            exc = AbortedError(
                f"aborted because rank {origin} failed: {text}",
                group=gid,
                ranks=(origin,),
                remote=True,
            )
        exc.abort_payload = json.dumps(info).encode()
        ex.remote_abort(seq, exc)

    # --- failure report and shutdown --------------------------------------------------------------
    def report_failure(self, text: str) -> None:
        if self.store is not None:
            try:
                self.store.set(FAILURE_KEY.format(rank=self.rank), failure_record(text[:4096]))
            except Exception:
                pass

    def close(self) -> None:
        for ex in list(self.executors.values()):
            ex.close()
        self.fabric.close()
        if self.store is not None:
            try:
                down = f"unison/{self.epoch}/down"
                if self.store.add(down, 1) >= self.size:
                    self.store.set(f"{down}/all", b"1")
                if self.server is not None:  # keep serving until every rank has left
                    self.store.wait([f"{down}/all"], timeout=10)
            except Exception:
                pass
            self.store.close()
        if self.server is not None:
            self.server.close()
