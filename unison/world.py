"""The job's world: which engine runs it, and ``init``/``current``/``shutdown``.

``init()`` picks a backend from :data:`BACKENDS` by name (``backend=`` or
``UNISON_BACKEND``, default ``native``) and opens its runtime; every group of the
job then runs on that backend. In an elastic job (``UNISON_ELASTIC_ID``) ``init`` first
waits for this worker's next world (:mod:`unison.elastic`): after a reset,
``shutdown()`` then ``init()`` joins the new world with its new rank and size.
Layer: above the backends (it imports them), below the public API
(:mod:`unison.comm.api` asks :func:`current` for the world).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from . import elastic
from .config import ENV_PS_JOIN, Config, load_config
from .errors import AbortedError, InvalidArgumentError, NotInitializedError
from .jobdir import release_all
from .log import configure, get_logger, set_rank

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .comm.group import Group

__all__ = ["BACKENDS", "World", "adopt", "current", "init", "is_initialized", "shutdown"]

log = get_logger("elastic")


class World(Protocol):
    """What every backend's runtime offers the API (native: :class:`Runtime`)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    config: Config
    world: Group

    def new_group(
        self, ranks: Sequence[int] | None, *, timeout: float | None = None, arena: bool = True
    ) -> Group: ...
    def report_failure(self, text: str) -> None: ...
    def close(self) -> None: ...


def _open_native(config: Config, **job: Any) -> World:
    from .backends.native import open_runtime

    return open_runtime(config, **job)


def _open_mpi(config: Config, **job: Any) -> World:
    from .backends.mpi import open_runtime

    return open_runtime(config)


def _open_torch(config: Config, **job: Any) -> World:
    from .backends.torch import open_runtime

    return open_runtime(config)


#: backend name -> opener (``init(backend=...)`` accepts exactly these names)
BACKENDS: dict[str, Callable[..., World]] = {
    "native": _open_native,
    "mpi": _open_mpi,
    "torch": _open_torch,
}

_LOCK = threading.Lock()
_RT: World | None = None


def current() -> World:
    """The runtime of the job this process joined (raises if none)."""
    rt = _RT
    if rt is None:
        raise NotInitializedError("unison is not initialized: call unison.init() first")
    return rt


def is_initialized() -> bool:
    return _RT is not None


_prev_hook = sys.excepthook


_failed = False


def _excepthook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    global _failed
    rt = _RT
    if rt is not None:
        _failed = True
        rt.report_failure(f"{tp.__name__}: {value}")
    _prev_hook(tp, value, tb)


def _healthy(rt: World) -> bool:
    """No group of this rank has failed (a failed group may not even reach the store)."""
    groups = getattr(rt, "groups", None)
    comms = [rt.world, *(groups.values() if isinstance(groups, dict) else ())]
    return all(getattr(c, "broken", None) is None for c in comms)


def _at_exit() -> None:
    """An interpreter that ends without :func:`shutdown` still leaves in order, as
    Horovod and mpi4py do (peers see a goodbye, not a lost connection); after an
    uncaught exception or a failed collective it just goes, as before (peers should see
    the failure, and a broken job must not delay the exit). Registered at import, so it
    runs after ``unison.torch``'s own exit hook. Then the job's derived file-store
    directory is counted out (:mod:`unison.jobdir`)."""
    try:
        rt = _RT
        if rt is not None and not _failed and _healthy(rt):
            shutdown()
    finally:
        release_all()


atexit.register(_at_exit)


def init(
    *,
    rank: int | None = None,
    size: int | None = None,
    store_addr: str | tuple[str, int] | None = None,
    secret: bytes | str | None = None,
    timeout: float | None = None,
    backend: str | None = None,
) -> None:
    """Join the job. Idempotent: a second call while initialized does nothing.

    ``backend`` (default ``UNISON_BACKEND``, else ``"native"``) picks the engine that
    moves the bytes: ``"mpi"`` (mpi4py, under mpirun/srun) or ``"torch"``
    (torch.distributed: Gloo for CPU, NCCL for CUDA tensors).
    """
    global _RT
    with _LOCK:
        if _RT is not None:
            return
        cfg = load_config()
        if timeout is not None:
            if timeout <= 0:
                raise InvalidArgumentError(f"timeout must be > 0, got {timeout}")
            cfg = cfg.replace(timeout=float(timeout))
        name = cfg.backend if backend is None else backend
        opener = BACKENDS.get(name)
        if opener is None:
            raise InvalidArgumentError(
                f"backend must be one of {', '.join(BACKENDS)}; got {name!r}"
            )
        cfg = cfg.replace(backend=name)
        configure(cfg.log_level)
        if rank is None and size is None and os.environ.get(ENV_PS_JOIN):
            raise InvalidArgumentError(
                f"this process was started to join a running parameter-server job "
                f"({ENV_PS_JOIN}): call unison.ps.init(), which connects it to the servers, "
                "instead of unison.init()"
            )
        if rank is None and size is None and elastic.enabled():
            rt = _open_elastic(opener, cfg, store_addr, secret)
        else:
            rt = opener(cfg, rank=rank, size=size, store_addr=store_addr, secret=secret)
        set_rank(rt.rank)
        _RT = rt
        sys.excepthook = _excepthook


def adopt(rt: World) -> None:
    """Make ``rt``, a world opened outside :func:`init`, this process's world (a worker
    joining a running parameter-server job: its world with the servers)."""
    global _RT
    with _LOCK:
        if _RT is not None:
            raise InvalidArgumentError("unison is already initialized in this process")
        set_rank(rt.rank)
        _RT = rt
        sys.excepthook = _excepthook


def _open_elastic(
    opener: Callable[..., World],
    cfg: Config,
    store_addr: str | tuple[str, int] | None,
    secret: bytes | str | None,
) -> World:
    """Join this worker's next world; a world whose rendezvous the driver cancelled (a
    member died before it joined) is left for the one that replaced it."""
    while True:
        ecfg = elastic.join(cfg)  # this worker's next world (rank, size, round)
        try:
            return opener(ecfg, store_addr=store_addr, secret=secret)
        except AbortedError as exc:
            # only a rendezvous the driver cancelled: it publishes the replacing world first
            if exc.op != "init" or elastic.worker().latest() <= ecfg.elastic_round:
                raise
            log.warning("elastic: world %d did not form (%s)", ecfg.elastic_round, exc)


def shutdown() -> None:
    """Leave the job: close connections, stop threads, release the store."""
    global _RT
    with _LOCK:
        rt, _RT = _RT, None
        if rt is not None:
            sys.excepthook = _prev_hook
            try:
                # closing ends what the groups' calls still owe their peers (a root's
                # open batch of broadcasts waits for its receiver's receipt): retired
                # groups would count as failed and skip it
                rt.close()
            finally:
                _retire_groups(rt)


def _retire_groups(rt: World) -> None:
    """Groups of a world being shut down say so when used again (an elastic reset
    re-forms the world: groups made before it must be made again after init())."""
    where = f"elastic round {elastic.current_round()}" if elastic.enabled() else "a world"
    groups: dict[int, Group] = getattr(rt, "groups", {})  # native runtimes keep them
    why = (
        f"it belongs to {where} that was shut down (groups made before unison.shutdown() "
        "or an elastic reset cannot be used after it: create them again after unison.init())"
    )
    for comm in groups.values():
        comm.retire(NotInitializedError(why))  # every later use is refused with this
    for ex in list(getattr(rt, "executors", {}).values()):
        ex.retire(why)
