"""Elastic parameter-server jobs: how a worker joins servers that are already serving.

The servers and the first workers share the job's world, formed once at
:func:`unison.ps.init`. A worker started later (``UNISON_PS_JOIN=<worker id>``: a
replacement keeps the id of the worker it replaces, a new one takes the next id) cannot
enter that world, so it forms a small world of its own with the servers, through the
job's store:

1. the servers publish the job's settings under :data:`JOB_KEY` when they start serving
   (number of servers, consistency, ``split_bytes``);
2. a ticket ``n`` is claimed for the worker (a store counter; its id is written under
   ``unison/ps/join/<n>``): by the launcher before it starts the worker
   (``UNISON_PS_JOIN_TICKET``), so that it can cancel the servers' wait for a worker that
   dies before it connects (:func:`cancel_join`), or else by the worker itself; the
   worker opens world ``n`` of ``servers + 1`` ranks: server ``i`` is rank ``i``, the
   worker is rank ``servers``;
3. each server watches the tickets in order (:class:`JoinWatcher`), opens the same world
   and serves the worker over it beside everyone else.

Each such world is an ordinary authenticated unison world (its own rendezvous epoch), so
nothing in the transport knows about joining. What the worker does once connected (its
first clock, the keys it pulls) is :mod:`unison.ps.worker`'s and :mod:`unison.ps.state`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from .. import config as C
from ..bootstrap import CANCEL_KEY
from ..config import Config
from ..elastic.rendezvous import epoch_of
from ..errors import InvalidArgumentError, MismatchError, StoreTimeoutError, UnsupportedError
from ..jobenv import JobInfo, detect_job
from ..log import get_logger
from ..store import FileStore, Store, TCPStore
from .consistency import Consistency

__all__ = [
    "JOB_KEY",
    "JoinWatcher",
    "cancel_join",
    "claim_ticket",
    "join_id",
    "open_join_world",
    "publish_job",
    "request_join",
]

log = get_logger("ps")

#: the servers' settings, JSON, written when they start serving an elastic job
JOB_KEY = "unison/ps/job"
_TICKETS = "unison/ps/joins"
_JOIN = "unison/ps/join/{n}"
#: join worlds rendezvous as elastic rounds JOIN_EPOCH + n (apart from the launcher's rounds)
JOIN_EPOCH = 1 << 20
_POLL = 0.5  # seconds between looks for the next ticket (and at the stop flag)


def join_id() -> int | None:
    """This process's worker id if it was started to join a running job, else None."""
    raw = os.environ.get(C.ENV_PS_JOIN, "").strip()
    if not raw:
        return None
    try:
        wid = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{C.ENV_PS_JOIN}={raw!r} is not a worker id") from None
    if wid < 0:
        raise InvalidArgumentError(f"{C.ENV_PS_JOIN}={wid}: a worker id is >= 0")
    return wid


def claim_ticket(store: Store, worker: int) -> int:
    """Claim the next join for ``worker``: the servers open it in ticket order."""
    ticket = store.add(_TICKETS, 1)
    store.set(_JOIN.format(n=ticket), json.dumps({"id": worker}).encode())
    return ticket


def cancel_join(store: Store, ticket: int, why: str) -> None:
    """Make the servers stop waiting for join ``ticket`` (its worker died before it
    connected); harmless once the worker has joined. The rendezvous key is the one the
    native runtime uses for elastic round ``JOIN_EPOCH + ticket``."""
    store.set(CANCEL_KEY.format(epoch=epoch_of(JOIN_EPOCH + ticket)), why.encode())


def _job_of(world: Any) -> JobInfo:
    job = getattr(world, "job", None)
    if not isinstance(job, JobInfo):
        raise UnsupportedError(
            "an elastic parameter-server job needs the native backend (UNISON_BACKEND=native)"
        )
    return job


def open_store(job: JobInfo, timeout: float) -> Store:
    """A new client of the job's store."""
    if job.store_addr is not None:
        return TCPStore(job.store_addr[0], job.store_addr[1], job.secret, timeout=timeout)
    if job.store_path:
        return FileStore(job.store_path, timeout=timeout)
    raise InvalidArgumentError("the elastic parameter server needs the job's store address")


def open_join_world(job: JobInfo, config: Config, ticket: int, rank: int, servers: int) -> Any:
    """World ``ticket`` of the servers (ranks ``0 .. servers-1``) and one joining worker
    (rank ``servers``); this process is ``rank``."""
    from ..backends.native import start_runtime

    mine = dataclasses.replace(
        job,
        rank=rank,
        size=servers + 1,
        local_rank=None,
        local_size=None,
        cross_rank=None,
        cross_size=None,
        host_store=False,
    )
    return start_runtime(mine, config.replace(elastic_round=JOIN_EPOCH + ticket))


def publish_job(world: Any, servers: int, policy: Consistency, split_bytes: int) -> None:
    """Server side: tell joining workers what the job is (every server writes the same)."""
    store = open_store(_job_of(world), world.config.timeout)
    try:
        store.set(
            JOB_KEY,
            json.dumps(
                {"servers": servers, "consistency": list(policy.key()), "split_bytes": split_bytes}
            ).encode(),
        )
    finally:
        store.close()


def request_join(
    worker: int, config: Config, consistency: Consistency | None, split_bytes: int
) -> tuple[Any, dict[str, Any]]:
    """Worker side: open this worker's world with the servers; (the world, the settings)."""
    job = detect_job(os.environ)
    store = open_store(job, config.timeout)
    try:
        try:
            raw = store.get(JOB_KEY, timeout=config.timeout)
        except StoreTimeoutError:
            raise StoreTimeoutError(
                f"ps.init: worker {worker} was started to join a running parameter-server job "
                f"({C.ENV_PS_JOIN}), but no server published the job within "
                f"{config.timeout:g} s"
            ) from None
        settings: dict[str, Any] = json.loads(raw.decode())
        theirs = (str(settings["consistency"][0]), int(settings["consistency"][1]))
        if consistency is not None and consistency.key() != theirs:
            raise MismatchError(
                f"ps.init: worker {worker} asks for {consistency!r}; the running job uses {theirs}",
                op="ps.init",
            )
        if split_bytes != settings["split_bytes"]:
            raise MismatchError(
                f"ps.init: worker {worker} asks for split_bytes={split_bytes}; the running job "
                f"uses {settings['split_bytes']}",
                op="ps.init",
            )
        raw_ticket = os.environ.get(C.ENV_PS_JOIN_TICKET, "").strip()
        ticket = int(raw_ticket) if raw_ticket else claim_ticket(store, worker)
    finally:
        store.close()
    servers = int(settings["servers"])
    log.info("worker %d joins the running job (world %d with %d servers)", worker, ticket, servers)
    return open_join_world(job, config, ticket, servers, servers), settings


class JoinWatcher:
    """Server side: opens each joining worker's world, in ticket order, on its own thread,
    and hands ``(worker id, ticket, world)`` to ``on_join``."""

    def __init__(
        self, world: Any, index: int, servers: int, on_join: Callable[[int, int, Any], None]
    ) -> None:
        self.job = _job_of(world)
        self.config: Config = world.config
        self.index, self.servers = index, servers
        self.on_join = on_join
        self.worlds: list[Any] = []
        self._stop = threading.Event()
        self._store = open_store(self.job, self.config.timeout)
        self._thread = threading.Thread(target=self._run, name="unison-ps-join", daemon=True)

    def start(self) -> JoinWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        ticket = 1
        while not self._stop.is_set():
            key = _JOIN.format(n=ticket)
            try:
                self._store.wait([key], timeout=_POLL)
                worker = int(json.loads(self._store.get(key, timeout=5.0))["id"])
            except StoreTimeoutError:
                continue
            except Exception as exc:  # the store went away: the job is ending
                if not self._stop.is_set():
                    log.warning("server %d: watching for joins failed: %r", self.index, exc)
                return
            try:
                rt = open_join_world(self.job, self.config, ticket, self.index, self.servers)
            except Exception as exc:  # the launcher says why and starts another: INFO
                log.info(
                    "server %d: worker %d (join %d) did not connect: %s",
                    self.index,
                    worker,
                    ticket,
                    exc,
                )
            else:
                self.worlds.append(rt)
                self.on_join(worker, ticket, rt)
            ticket += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * _POLL + 1)
        for rt in self.worlds:
            try:
                rt.close()
            except Exception as exc:
                log.warning("closing a joined worker's world failed: %r", exc)
        self._store.close()
