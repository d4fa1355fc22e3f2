"""A parameter server on unison: BSP, ASP and SSP consistency, sharded keys, server-side rules.

::

    unison run -np 6 --servers 2 python train_ps.py      # 2 server processes, 4 workers

    import unison.ps as ps
    kv = ps.init(consistency=ps.SSP(staleness=3))         # on a server: serves, then exits
    kv.init_params({"w1": w1, "b1": b1})                  # first writer wins
    kv.set_optimizer(ps.SGD(lr=0.1, momentum=0.9))        # applied on the servers
    for step in range(steps):
        params = kv.pull(["w1", "b1"])
        kv.push({"w1": g1, "b1": gb1})
        kv.clock()

Roles: with ``UNISON_NUM_SERVERS=N`` (``unison run --servers N`` sets it) the
**last** N ranks are servers and ranks 0 .. size-N-1 are workers, so worker i is
rank i; ``UNISON_ROLE=server|worker`` on a process overrides that (for other
launchers). :func:`init` is collective over every rank of the job.

Elastic jobs (``UNISON_PS_ELASTIC=1``; ``unison run --servers N`` with ``--min-np``,
``--max-np`` or ``--host-discovery-script``): a lost worker leaves the consistency
clocks instead of failing the others, and a worker started later with
``UNISON_PS_JOIN=<id>`` joins the running servers in :func:`init` (:mod:`.join`).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

from .. import config as C
from ..comm import objects as _objects
from ..errors import InvalidArgumentError, MismatchError
from ..log import configure, get_logger
from ..world import adopt as _adopt
from ..world import current, is_initialized
from ..world import init as _init_runtime
from ..world import shutdown as _shutdown
from .checkpoint import load
from .consistency import ASP, BSP, SSP, Consistency, from_key
from .join import join_id, request_join
from .partition import DEFAULT_SPLIT_BYTES, Piece, home, layout
from .rules import SGD, Adam, Assign, Custom, Rule, Sum
from .server import Server, ServerSummary
from .worker import KVStore

__all__ = [
    "ASP",
    "BSP",
    "SGD",
    "SSP",
    "Adam",
    "Assign",
    "Consistency",
    "Custom",
    "KVStore",
    "Piece",
    "Rule",
    "ServerSummary",
    "Sum",
    "home",
    "init",
    "layout",
    "load",
    "role",
    "serve",
]

log = get_logger("ps")
_ROLES = ("worker", "server")


def role() -> str:
    """This process's role, ``"worker"`` or ``"server"``, from the environment."""
    explicit = os.environ.get(C.ENV_ROLE, "").strip().lower()
    if explicit:
        if explicit not in _ROLES:
            raise InvalidArgumentError(f"{C.ENV_ROLE}={explicit!r}: expected worker or server")
        return explicit
    raw = os.environ.get(C.ENV_NUM_SERVERS, "").strip()
    if not raw:
        return "worker"
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{C.ENV_NUM_SERVERS}={raw!r} is not an integer") from None
    rank, size = int(os.environ.get(C.ENV_RANK, "0")), int(os.environ.get(C.ENV_SIZE, "1"))
    if is_initialized():
        rank, size = current().rank, current().size
    if not 0 < n < size:
        raise InvalidArgumentError(
            f"{C.ENV_NUM_SERVERS}={n} needs 1 <= servers < ranks ({size}): "
            "at least one worker and one server"
        )
    return "server" if rank >= size - n else "worker"


def _negotiate(
    consistency: Consistency | None, split_bytes: int
) -> tuple[str, list[int], list[int], Consistency]:
    """Everyone's role and settings. A server given no policy takes the workers'."""
    if consistency is not None and not isinstance(consistency, Consistency):
        raise InvalidArgumentError(
            f"consistency must be ps.BSP(), ps.ASP() or ps.SSP(s), got {consistency!r}"
        )
    if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 1:
        raise InvalidArgumentError(f"split_bytes must be an int >= 1, got {split_bytes!r}")
    if not is_initialized():
        _init_runtime()
    mine = role()
    rt = current()
    if consistency is None and mine == "worker":
        consistency = BSP()
    key = None if consistency is None else consistency.key()
    views = _objects.all_gather_object(rt.world, (mine, key, split_bytes))
    servers = [r for r, v in enumerate(views) if v[0] == "server"]
    workers = [r for r, v in enumerate(views) if v[0] == "worker"]
    if not servers or not workers:
        raise InvalidArgumentError(
            f"the parameter server needs at least one server and one worker; got servers "
            f"{servers} and workers {workers} (start with `unison run -np N --servers S`, or set "
            f"{C.ENV_NUM_SERVERS} / {C.ENV_ROLE})"
        )
    settings = {(v[1], v[2]) for v in views if v[1] is not None}
    if len(settings) > 1:
        raise MismatchError(
            "ranks disagree about the parameter server's settings: "
            + ", ".join(f"rank {r}: {v[1]} split_bytes={v[2]}" for r, v in enumerate(views)),
            op="ps.init",
            ranks=range(len(views)),
        )
    policy = from_key(views[workers[0]][1])
    return mine, workers, servers, policy


def serve(
    consistency: Consistency | None = None, *, split_bytes: int = DEFAULT_SPLIT_BYTES
) -> ServerSummary:
    """Run this process as a server until every worker has left; a summary of its work.

    ``consistency=None`` takes the workers' policy.
    Collective with :func:`init` on the other ranks. :func:`init` calls it on
    server processes and then exits; call it directly to keep the process.
    """
    mine, workers, servers, policy = _negotiate(consistency, split_bytes)
    if mine != "server":
        raise InvalidArgumentError(f"ps.serve() on rank {current().rank}, a worker")
    return _server(workers, servers, policy, split_bytes).serve()


def _server(
    workers: list[int], servers: list[int], policy: Consistency, split_bytes: int
) -> Server:
    rt = current()
    return Server(
        rt.world,
        servers.index(rt.rank),
        workers,
        policy,
        rt.config.timeout,
        servers=len(servers),
        split_bytes=split_bytes,
        runtime=rt,
    )


def _exit_server(summary: ServerSummary) -> NoReturn:
    _shutdown()
    if summary.failure is not None:
        print(f"unison.ps server rank {summary.rank}: {summary.failure}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


def init(
    consistency: Consistency | None = None, *, split_bytes: int = DEFAULT_SPLIT_BYTES
) -> KVStore:
    """Join the parameter-server job (collective over every rank; calls ``unison.init()``).

    On a worker, returns its :class:`KVStore`; at interpreter exit the store is
    closed and unison shut down if the program has not done so. On a server,
    serves until every worker has left and then exits the process (status 0, or 1
    when a worker was lost). ``consistency`` defaults to :class:`BSP`; tensors of
    ``split_bytes`` or more are split across all servers. Every rank must pass
    the same settings (a server may pass ``consistency=None`` to take the workers').
    A worker started with ``UNISON_PS_JOIN`` joins a running elastic job instead (not
    collective): its :attr:`KVStore.joined_at` is the clock it starts at.
    """
    wid = join_id()
    if wid is not None:
        return _join(wid, consistency, split_bytes)
    mine, workers, servers, policy = _negotiate(consistency, split_bytes)
    rt = current()
    if mine == "server":
        _exit_server(_server(workers, servers, policy, split_bytes).serve())
    kv = KVStore(rt.world, workers, servers, policy, split_bytes)
    atexit.register(_at_exit, kv)
    return kv


def _join(wid: int, consistency: Consistency | None, split_bytes: int) -> KVStore:
    """A worker started to join a running elastic job (``UNISON_PS_JOIN``)."""
    if consistency is not None and not isinstance(consistency, Consistency):
        raise InvalidArgumentError(
            f"consistency must be ps.BSP(), ps.ASP() or ps.SSP(s), got {consistency!r}"
        )
    if is_initialized():
        raise InvalidArgumentError(
            f"ps.init: worker {wid} joins a running job ({C.ENV_PS_JOIN}): call ps.init() "
            "without unison.init() first (it opens this worker's world with the servers)"
        )
    cfg = C.load_config()
    configure(cfg.log_level)
    rt, settings = request_join(wid, cfg, consistency, split_bytes)
    _adopt(rt)
    n = int(settings["servers"])
    policy = from_key((str(settings["consistency"][0]), int(settings["consistency"][1])))
    kv = KVStore(rt.world, [n], list(range(n)), policy, split_bytes, worker_id=wid)
    kv._join()
    log.debug("worker %d joined the running job at clock %d", wid, kv.current_clock)
    atexit.register(_at_exit, kv)
    return kv


def _at_exit(kv: KVStore) -> None:
    failing = getattr(sys, "last_value", None)
    try:
        if is_initialized():
            kv.close(failing if isinstance(failing, BaseException) else None)
    except Exception as exc:
        log.warning("closing the parameter-server client at exit failed: %r", exc)
    _shutdown()
