"""The seam between validation and the engine that moves bytes.

:mod:`unison.comm.collectives` validates every argument and then hands *validated*
buffers to a :class:`Backend`: one method per collective and per p2p direction.
The native engine (unison's own transports and algorithms) is the default; the
``mpi`` and ``torch`` backends run every operation on mpi4py or torch.distributed.

A backend sees group ranks for roots, global ranks for p2p peers, flat numpy views
(:class:`unison.buffers.Buffer`) for buffers, and returns a :class:`Work` when
``async_op`` is true (blocking calls wait on that same Work, so one deadline logic
serves both). :class:`BackendRuntime` stands in for the native runtime: identity,
world and groups, with the bytes moved by the backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._types import ReduceOp
from ..buffers import Buffer
from ..comm.work import Work
from ..errors import (
    CollectiveTimeoutError,
    CommunicationError,
    InvalidArgumentError,
    UnisonError,
)

if TYPE_CHECKING:
    from ..comm.communicator import Communicator
    from ..config import Config

__all__ = ["Backend", "BackendRuntime", "PollWork", "comm_error", "finish"]


class Backend(Protocol):
    """What an engine implements; every argument has been validated already."""

    name: str

    def broadcast(self, comm: Communicator, b: Buffer, root: int, async_op: bool) -> Work | None:
        """Copy group rank ``root``'s ``b`` into every rank's ``b``."""

    def all_reduce(
        self, comm: Communicator, b: Buffer, op: ReduceOp, async_op: bool
    ) -> Work | None:
        """Reduce ``b`` in place over the group."""

    def reduce(
        self, comm: Communicator, b: Buffer, root: int, op: ReduceOp, async_op: bool
    ) -> Work | None:
        """Reduce ``b`` into group rank ``root``'s ``b``; others stay unchanged."""

    def all_gather(
        self, comm: Communicator, b: Buffer, outs: list[np.ndarray], async_op: bool, result: Any
    ) -> Work | None:
        """``outs[i]`` gets group rank i's ``b`` on every rank."""

    def gather(
        self,
        comm: Communicator,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
        async_op: bool,
    ) -> Work | None:
        """``outs[i]`` on ``root`` gets group rank i's ``b`` (``outs`` is None elsewhere)."""

    def scatter(
        self,
        comm: Communicator,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
        async_op: bool,
    ) -> Work | None:
        """Group rank i's ``b`` gets ``ins[i]`` from ``root``."""

    def reduce_scatter(
        self,
        comm: Communicator,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
        async_op: bool,
    ) -> Work | None:
        """Group rank i's ``out`` gets the reduction of every rank's ``ins[i]``."""

    def all_to_all(
        self,
        comm: Communicator,
        outs: list[np.ndarray],
        ins: list[np.ndarray],
        async_op: bool,
        result: Any,
        ref: Buffer | None = None,
    ) -> Work | None:
        """``ins[j]`` goes to group rank j, which receives it into its ``outs[me]``."""

    def barrier(self, comm: Communicator, async_op: bool) -> Work | None:
        """Return when every member has entered."""

    def isend(self, comm: Communicator, b: Buffer, peer: int, tag: int) -> Work:
        """Start sending ``b`` to global rank ``peer``."""

    def irecv(self, comm: Communicator, b: Buffer, peer: int, tag: int) -> Work:
        """Start receiving from global rank ``peer`` into ``b``."""

    def new_group(self, gid: int, ranks: Sequence[int]) -> None:
        """Make the engine's communicator for group ``gid`` (collective over the world)."""

    def close(self) -> None:
        """Release the engine's resources (communicators, process groups)."""


class PollWork(Work):
    """A Work over an engine request: ``test()`` says done (raising its error), ``done()``
    post-processes (AVG division, copies), all within the operation's deadline.

    Waiting polls, yielding the CPU, for the first 2 ms, then backs off from 50 µs to
    1 ms: engines' blocking waits have no deadline, and unison's calls never hang.
    ``block``, where the engine has a wait bounded by its own timeout (Gloo, NCCL),
    serves a wait without a timeout instead of polling.
    """

    def __init__(
        self,
        name: str,
        test: Callable[[], bool],
        timeout: float,
        translate: Callable[[BaseException], BaseException],
        done: Callable[[], Any] | None = None,
        block: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name)
        self._block = block
        self._test = test
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._translate = translate
        self._post = done
        self._plock = threading.Lock()

    def _poll(self) -> bool:
        with self._plock:
            if self._done:
                return True
            try:
                if not self._test():
                    if time.monotonic() < self._deadline:
                        return False
                    self._finish(
                        error=CollectiveTimeoutError(
                            f"{self.name} did not complete within {self._timeout:g}s",
                            op=self.name,
                        )
                    )
                    return True
                result = self._post() if self._post is not None else None
            except UnisonError as exc:
                self._finish(error=exc)
            except BaseException as exc:
                self._finish(error=self._translate(exc))
            else:
                self._finish(result)
            return True

    def _wait_done(self, timeout: float | None) -> bool:
        if self._poll():
            return True
        if timeout is None and self._block is not None:
            try:
                self._block()
            except BaseException:
                pass  # test() raises it again, translated, from _poll
            if self._poll():
                return True
        now = time.monotonic()
        end = None if timeout is None else now + timeout
        spin_until = now + 2e-3
        pause = 0.0
        while True:
            now = time.monotonic()
            if end is not None and now >= end:
                return self._poll()
            time.sleep(pause)  # sleep(0) yields the processor
            if now >= spin_until:
                pause = min(max(pause * 2, 5e-5), 1e-3)
            if self._poll():
                return True


def finish(work: Work, async_op: bool) -> Work | None:
    """Return ``work`` for an async call, else wait for it (raising its error)."""
    if async_op:
        return work
    work.wait()
    return None


class BackendRuntime:
    """The runtime of a job whose bytes move on an external engine.

    Offers what :class:`unison.comm.runtime.Runtime` offers the API: identity, the
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
        from ..comm.communicator import Communicator

        self.backend = backend
        self.config = config
        self.rank = rank
        self.size = size
        self.local_rank, self.local_size, self.cross_rank, self.cross_size = local
        self.op_hook: Callable[[Any, int, Any], None] | None = None
        self.store = None
        self.groups: dict[int, Communicator] = {}
        self.stuck: dict[int, tuple[int, int, str]] = {}
        self._next_gid = 1
        self._lock = threading.Lock()
        self.world = Communicator(self, 0, range(size))  # type: ignore[arg-type]
        self.groups[0] = self.world

    def new_group(self, ranks: Sequence[int] | None) -> Communicator:
        from ..comm.communicator import Communicator

        members = list(range(self.size)) if ranks is None else [int(r) for r in ranks]
        if not members or len(set(members)) != len(members):
            raise InvalidArgumentError(
                f"new_group: ranks must be distinct and non-empty, got {list(ranks or [])}"
            )
        bad = [r for r in members if not 0 <= r < self.size]
        if bad:
            raise InvalidArgumentError(f"new_group: ranks {bad} are outside 0..{self.size - 1}")
        with self._lock:
            gid = self._next_gid
            self._next_gid += 1
        members.sort()
        self.backend.new_group(gid, members)
        comm = Communicator(self, gid, members)  # type: ignore[arg-type]
        self.groups[gid] = comm
        return comm

    @property
    def router(self) -> _P2PRouter:
        """What :meth:`Communicator.isend`/``irecv`` post to: the backend's p2p."""
        return _P2PRouter(self)

    def report_failure(self, text: str) -> None:
        """Failures are reported by the engine's own launcher (mpirun, torchrun)."""

    def close(self) -> None:
        for comm in list(self.groups.values()):
            comm.close()
        self.backend.close()


class _Request:
    """A backend p2p Work seen as a transport request (``wait(timeout) -> bool``)."""

    def __init__(self, work: Work, peer: int) -> None:
        self.work = work
        self.peer = peer

    def wait(self, timeout: float) -> bool:
        if not self.work._wait_done(timeout):
            return False
        err = self.work._error
        if err is not None:
            raise err if isinstance(err, CommunicationError) else CommunicationError(str(err))
        return True


class _P2PRouter:
    """Routes :class:`Communicator`'s own ``isend``/``irecv`` (used by unison.ps) to the
    backend: the key is (kind, group id, 0, tag), the payload a byte view."""

    def __init__(self, rt: BackendRuntime) -> None:
        self.rt = rt

    def _buffer(self, arr: np.ndarray) -> Buffer:
        from ..buffers import DType

        return Buffer(arr.view(np.uint8).reshape(-1), DType.UINT8, arr)

    def isend(self, peer: int, key: Any, data: np.ndarray, sig: Any, deadline: float) -> _Request:
        comm = self.rt.groups[int(key[1])]
        return _Request(self.rt.backend.isend(comm, self._buffer(data), peer, int(key[3])), peer)

    def irecv(self, peer: int, key: Any, data: np.ndarray, sig: Any) -> _Request:
        comm = self.rt.groups[int(key[1])]
        return _Request(self.rt.backend.irecv(comm, self._buffer(data), peer, int(key[3])), peer)

    def cancel(self, peer: int, req: Any) -> None:
        """Engines cannot withdraw a posted receive portably; it ends at its deadline."""


def comm_error(backend: str, name: str, exc: BaseException) -> CommunicationError:
    """An engine's exception as a unison error naming the backend and the operation."""
    if isinstance(exc, CommunicationError):
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timeout" in text.lower() or "timed out" in text.lower():
        return CollectiveTimeoutError(f"{name} on the {backend} backend: {text}", op=name)
    return CommunicationError(f"{name} on the {backend} backend failed: {text}", op=name)
