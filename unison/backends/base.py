"""What the external engines (``mpi``, ``torch``) share: the runtime of a job whose
bytes move on such an engine, and the Work over an engine request (:func:`poll_work`).

The seam itself, :class:`unison.comm.backend.Backend`, lives in ``comm``.
:class:`BackendRuntime` stands in for the native runtime: identity, world and
groups, with the bytes moved by the backend.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..comm.group import Group, check_members
from ..comm.work import Work
from ..errors import (
    CollectiveTimeoutError,
    CommunicationError,
    LaunchError,
    UnisonError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from ..comm.backend import Backend
    from ..config import Config

__all__ = [
    "BackendRuntime",
    "check_launch",
    "check_launch_alone",
    "comm_error",
    "pack",
    "poll_work",
    "raw",
    "unpack",
]


# --- buffer preparation shared by the engines -------------------------------------------------
def raw(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes, a view (flat contiguous buffers: what every engine moves)."""
    return a.view(np.uint8)


def pack(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """The bytes of ``blocks`` end to end in one new buffer (none: zero bytes)."""
    if not blocks:
        return np.empty(0, np.uint8)
    return np.concatenate([raw(b) for b in blocks])


def unpack(flat: np.ndarray, outs: Sequence[np.ndarray]) -> None:
    """Copy consecutive bytes of ``flat`` into each of ``outs``, in order."""
    at = 0
    for o in outs:
        n = int(o.nbytes)
        raw(o)[:] = flat[at : at + n]
        at += n


def poll_work(
    name: str,
    test: Callable[[], bool],
    timeout: float,
    translate: Callable[[BaseException], BaseException],
    done: Callable[[], Any] | None = None,
    block: Callable[[], Any] | None = None,
    on_error: Callable[[BaseException], object] | None = None,
    source: Callable[[], int] | None = None,
) -> Work:
    """A Work over an engine request: ``test()`` says done (raising its error), ``done()``
    post-processes (AVG division, copies) and gives the result, all within ``timeout``.

    Engines' blocking waits have no deadline and unison's calls never hang, so the
    request is polled (:class:`Work`'s wait loop yields, then backs off). ``block``, where
    the engine has a wait bounded by its own timeout (Gloo, NCCL), serves a wait without
    a timeout instead. ``on_error`` is told when the engine failed or timed out (the
    group's state is then unknown). ``source``, for a receive, names the sender (a
    global rank) once it finished: the Work's ``source``, as on the native engine.
    """
    deadline = time.monotonic() + timeout
    lock = threading.Lock()

    def fail(work: Work, exc: BaseException) -> None:
        if on_error is not None and not isinstance(exc, UnsupportedError):
            on_error(exc)
        work.finish(error=exc)

    def progress(work: Work, budget: float | None) -> bool:
        if budget is None and block is not None and not work.finished:
            try:
                block()
            except BaseException:
                pass  # test() raises it again, translated, below
        with lock:
            if work.finished:
                return True
            try:
                if not test():
                    if time.monotonic() < deadline:
                        return False
                    fail(
                        work,
                        CollectiveTimeoutError(
                            f"{name} did not complete within {timeout:g}s", op=name
                        ),
                    )
                    return True
                result = done() if done is not None else None
                if source is not None:
                    work.source = source()
            except UnisonError as exc:
                work.finish(error=exc)
            except BaseException as exc:
                fail(work, translate(exc))
            else:
                work.finish(result)
            return True

    return Work(name, progress=progress, polled=True)


#: how to start a job on each external engine, for the refusal below
_HOW = {
    "mpi": "mpirun -np {n} python SCRIPT (or srun -n {n}); `unison run` starts ranks for "
    "the native and torch backends only",
    "torch": "unison run -np {n} python SCRIPT, or torchrun --nproc-per-node {n} SCRIPT",
}


def check_launch(
    engine: str, rank: int, size: int, environ: Mapping[str, str] = os.environ
) -> None:
    """Refuse when the launcher's world (``UNISON_SIZE``/``HOROVOD_SIZE``, set by
    ``unison run`` and horovodrun) and the engine's world disagree: each process would
    otherwise run alone and compute wrong results without an error."""
    for var in ("UNISON_SIZE", "HOROVOD_SIZE"):
        text = environ.get(var, "").strip()
        if text.isdigit() and int(text) != size:
            n = int(text)
            how = _HOW.get(engine, "the engine's own launcher").format(n=n)
            raise LaunchError(
                f"rank {rank}: the launcher started {n} processes ({var}={n}) but the "
                f"{engine} engine sees a world of {size}: the processes did not join one job. "
                f"Start jobs on the {engine} backend with {how}"
            )


def check_launch_alone(engine: str, environ: Mapping[str, str] = os.environ) -> None:
    """:func:`check_launch` before the engine starts, in a process that none of the
    engine's launchers started: the engine's world would be this process alone."""
    rank = 0
    for var in ("UNISON_RANK", "HOROVOD_RANK"):
        text = environ.get(var, "").strip()
        if text.isdigit():
            rank = int(text)
            break
    check_launch(engine, rank, 1, environ)


class BackendRuntime:
    """The runtime of a job whose bytes move on an external engine.

    Offers what :class:`unison.backends.native.runtime.Runtime` offers the API: identity, the
    world group, :meth:`new_group`, failure reports and :meth:`close`.
    """

    def __init__(
        self,
        backend: Backend,
        config: Config,
        rank: int,
        size: int,
        local: tuple[int, int, int, int],
    ) -> None:
        self.backend = backend
        self.config = config
        self.rank = rank
        self.size = size
        self.local_rank, self.local_size, self.cross_rank, self.cross_size = local
        self._next_gid = 1
        self._lock = threading.Lock()
        self.world = Group(0, range(size), rank, config, backend)
        #: every group of this runtime, by id
        self.groups: dict[int, Group] = {0: self.world}

    def new_group(
        self, ranks: Sequence[int] | None, *, timeout: float | None = None, arena: bool = True
    ) -> Group:
        """A new group; ``timeout``: its operations' deadline (None: the job's);
        ``arena`` means nothing here (these engines reserve no shared arena)."""
        members = check_members(ranks, self.size)
        with self._lock:
            gid = self._next_gid
            self._next_gid += 1
        cfg = self.config if timeout is None else self.config.replace(timeout=timeout)
        self.backend.new_group(gid, members, cfg.timeout)
        g = Group(gid, members, self.rank, cfg, self.backend)
        self.groups[gid] = g
        return g

    def report_failure(self, text: str) -> None:
        """Failures are reported by the engine's own launcher (mpirun, torchrun)."""

    def close(self) -> None:
        self.backend.close()


def comm_error(backend: str, name: str, exc: BaseException) -> CommunicationError:
    """An engine's exception as a unison error naming the backend and the operation."""
    if isinstance(exc, CommunicationError):
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timeout" in text.lower() or "timed out" in text.lower():
        return CollectiveTimeoutError(f"{name} on the {backend} backend: {text}", op=name)
    return CommunicationError(f"{name} on the {backend} backend failed: {text}", op=name)
