"""The worker side: join the newest round that names this worker.

:func:`join` is what ``unison.init()`` calls in an elastic job (``UNISON_ELASTIC_ID``
set): it waits for a round newer than the one this process was last in, writes the
rank, size and layout it was given into the environment (``UNISON_*``, ``HOROVOD_*``
and torchrun's names, so job detection and user code read the new world) and
returns the config whose ``elastic_round`` makes the runtime rendezvous in that
round. :func:`hosts_updated` tells whether the driver has published a newer world
(what ``state.check_host_updates()`` asks).
"""

from __future__ import annotations

import os
import threading
import time

from .. import config as C
from ..errors import CollectiveTimeoutError, InvalidArgumentError, StoreTimeoutError
from ..log import get_logger
from ..store import Store, TCPStore
from .rendezvous import ROUND_KEY, Assignment, Round, latest_round, read_round

__all__ = ["ElasticWorker", "current_round", "enabled", "hosts_updated", "join", "worker"]

log = get_logger("elastic")
_LOCK = threading.Lock()
_WORKER: ElasticWorker | None = None
_ROUND: Round | None = None
JOIN_MARGIN = 10.0  # seconds a worker waits for a world beyond the driver's --elastic-timeout


class ElasticWorker:
    """One worker's view of the rounds in ``store``."""

    def __init__(self, store: Store, worker_id: str, timeout: float) -> None:
        self.store = store
        self.id = worker_id
        self.timeout = timeout

    def join(self, after: int) -> tuple[Round, Assignment]:
        """The first round newer than ``after`` that names this worker (the newest one
        published by then); raises CollectiveTimeoutError after ``timeout``."""
        deadline = time.monotonic() + self.timeout
        want = after + 1
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeoutError(
                    f"elastic worker {self.id}: no new world after round {after} within "
                    f"{self.timeout:g} s (--elastic-timeout / UNISON_ELASTIC_TIMEOUT)",
                    op="elastic.join",
                )
            try:
                self.store.wait([ROUND_KEY.format(n=want)], timeout=min(left, 5.0))
            except StoreTimeoutError:
                continue
            number = max(want, latest_round(self.store))
            rnd = read_round(self.store, number, max(left, 1.0))
            if self.id in rnd.workers:
                return rnd, rnd.workers[self.id]
            want = number + 1

    def latest(self) -> int:
        return latest_round(self.store)


def enabled() -> bool:
    """Whether this process is a worker of an elastic job."""
    return bool(os.environ.get(C.ENV_ELASTIC_ID))


def worker(cfg: C.Config | None = None) -> ElasticWorker:
    """This process's worker (opened once from the job environment)."""
    global _WORKER
    with _LOCK:
        if _WORKER is None:
            cfg = cfg or C.load_config()
            wid = os.environ.get(C.ENV_ELASTIC_ID, "")
            addr = os.environ.get(C.ENV_STORE_ADDR, "")
            secret = os.environ.get(C.ENV_SECRET, "")
            if not wid or not addr:
                raise InvalidArgumentError(
                    f"not an elastic worker: {C.ENV_ELASTIC_ID} and {C.ENV_STORE_ADDR} are "
                    "set by `unison run --min-np/--max-np/--host-discovery-script`"
                )
            host, _, port = addr.rpartition(":")
            store = TCPStore(host, int(port), bytes.fromhex(secret), timeout=cfg.timeout)
            # a little longer than the driver waits, so its verdict comes first
            _WORKER = ElasticWorker(store, wid, cfg.elastic_timeout + JOIN_MARGIN)
        return _WORKER


def _export(a: Assignment) -> None:
    env = os.environ
    for prefix in ("UNISON_", "HOROVOD_"):
        env[f"{prefix}RANK"], env[f"{prefix}SIZE"] = str(a.rank), str(a.size)
        env[f"{prefix}LOCAL_RANK"], env[f"{prefix}LOCAL_SIZE"] = (
            str(a.local_rank),
            str(a.local_size),
        )
        env[f"{prefix}CROSS_RANK"], env[f"{prefix}CROSS_SIZE"] = (
            str(a.cross_rank),
            str(a.cross_size),
        )
    env["RANK"], env["WORLD_SIZE"] = str(a.rank), str(a.size)
    env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"] = str(a.local_rank), str(a.local_size)
    env["GROUP_RANK"], env["GROUP_WORLD_SIZE"] = str(a.cross_rank), str(a.cross_size)


def join(cfg: C.Config) -> C.Config:
    """Wait for this worker's next world; ``cfg`` for the runtime that joins it."""
    global _ROUND
    w = worker(cfg)
    after = _ROUND.number if _ROUND is not None else -1
    rnd, a = w.join(after)
    _export(a)
    _ROUND = rnd
    if after >= 0:
        log.warning(
            "elastic reset: joined round %d (%s) as rank %d of %d",
            rnd.number,
            rnd.reason,
            a.rank,
            a.size,
        )
    return cfg.replace(elastic_round=rnd.number)


def current_round() -> int:
    """The round this process last joined (-1: none, not elastic)."""
    return _ROUND.number if _ROUND is not None else -1


def hosts_updated() -> bool:
    """Whether the driver published a world newer than the one this process is in."""
    if _ROUND is None:
        return False
    return worker().latest() > _ROUND.number
