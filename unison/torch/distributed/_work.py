"""torch.distributed ``Work`` over a unison operation, and unison's errors as torch's.

Errors: every :class:`unison.errors.CommunicationError` reaching torch code is
re-raised as :class:`DistBackendError` (torch's ``torch.distributed.DistBackendError``,
a ``RuntimeError``) whose subclass also keeps the unison type: a timeout is still a
``TimeoutError`` and a ``CollectiveTimeoutError``, a lost peer a ``PeerLostError``. The
message is unison's, naming the rank and the operation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ... import errors as E
from ...comm.work import Work as UWork

__all__ = [
    "DistAbortedError",
    "DistCollectiveTimeoutError",
    "DistCommunicationError",
    "DistMismatchError",
    "DistPeerLostError",
    "DoneWork",
    "UnisonWork",
    "done_work",
    "translate",
]


class DistCommunicationError(E.CommunicationError, dist.DistBackendError):
    """A unison :class:`~unison.errors.CommunicationError` as torch's DistBackendError."""

    def __reduce__(self) -> tuple[Any, ...]:
        # a module-level class with its message and attributes: torch's futures pickle
        # the exceptions they carry (and so does multiprocessing)
        return (type(self), (str(self),), dict(self.__dict__))


class DistCollectiveTimeoutError(DistCommunicationError, E.CollectiveTimeoutError):
    """A unison :class:`~unison.errors.CollectiveTimeoutError` (also a ``TimeoutError``)."""


class DistPeerLostError(DistCommunicationError, E.PeerLostError):
    """A unison :class:`~unison.errors.PeerLostError` (also a ``ConnectionError``)."""


class DistMismatchError(DistCommunicationError, E.MismatchError):
    """A unison :class:`~unison.errors.MismatchError`."""


class DistAbortedError(DistCommunicationError, E.AbortedError):
    """A unison :class:`~unison.errors.AbortedError`."""


_DIST: dict[type[BaseException], type[DistCommunicationError]] = {
    E.CommunicationError: DistCommunicationError,
    E.CollectiveTimeoutError: DistCollectiveTimeoutError,
    E.PeerLostError: DistPeerLostError,
    E.MismatchError: DistMismatchError,
    E.AbortedError: DistAbortedError,
}


def _torch_type(tp: type[BaseException]) -> type[DistCommunicationError]:
    """The Dist class of a unison error type (of its nearest listed base)."""
    for base in tp.__mro__:
        out = _DIST.get(base)
        if out is not None:
            return out
    return DistCommunicationError


def translate(exc: BaseException) -> BaseException:
    """unison's error as the error a torch.distributed user catches (same message)."""
    if isinstance(exc, dist.DistBackendError) or not isinstance(exc, E.CommunicationError):
        return exc
    new = _torch_type(type(exc))(str(exc))
    for name in ("op", "seq", "group", "ranks", "remote", "abort_payload"):
        setattr(new, name, getattr(exc, name, None))
    new.__cause__ = exc
    return new


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        secs = timeout.total_seconds()
        return None if secs <= 0 else secs  # torch's kNoTimeout is 0
    return float(timeout)


class UnisonWork(dist._Work):  # type: ignore[misc, name-defined]
    """torch's Work over one or more unison Works (all must finish), plus a finisher.

    ``finish`` runs once after every part succeeded (copy-back of staged tensors,
    division for AVG over integers...). ``get_future()`` completes with ``result``
    when the operation does, without anyone calling ``wait`` (DDP's hooks need that).
    """

    def __init__(
        self,
        name: str,
        parts: Sequence[UWork],
        result: list[torch.Tensor],
        finish: Callable[[], None] | None = None,
        source: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self._name = name
        self._parts = list(parts)
        self._tensors = result
        self._finisher = finish
        self._source = source
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future[Any] | None = None
        self._done: torch.futures.Future[None] | None = None  # completes _future
        self._when_finished: list[Callable[[], None]] = []  # see on_finished
        self._settling_arranged = False
        if not self._parts and finish is None:
            self._finished = True  # a blocking call that ran inline, or nothing to do

    # --- completion --------------------------------------------------------------------
    def _settle(self, timeout: float | None) -> bool:
        """Wait for the parts (up to ``timeout``); True once finished (ok or failed)."""
        if self._finished:
            return True
        err: BaseException | None = None
        try:
            for p in self._parts:
                p.wait(timeout)  # a Work.wait timeout raises CollectiveTimeoutError
        except E.CollectiveTimeoutError as exc:
            if not any(p.is_completed() and p.exception() is exc for p in self._parts):
                if timeout is not None and not all(p.is_completed() for p in self._parts):
                    raise  # only the caller's wait(timeout) ran out; the op goes on
            err = exc
        except BaseException as exc:
            err = exc
        with self._lock:
            if self._finished:
                return True
            if err is None and self._finisher is not None:
                try:
                    self._finisher()
                except BaseException as exc:
                    err = exc
            self._error = None if err is None else translate(err)
            for fn in self._when_finished:  # before anyone can see the work finished
                try:
                    fn()
                except Exception:  # an observer's failure is not the operation's
                    pass
            self._when_finished.clear()
            self._finished = True
            done = self._done
        if done is not None:
            self._complete_future(done)
        return True

    def _complete_future(self, done: torch.futures.Future[None]) -> None:
        if not done.done():
            done.set_result(None)  # the future handed out runs _outcome

    def _outcome(self, _done: torch.futures.Future[None]) -> list[torch.Tensor]:
        """The value of the future handed out, or its error.

        The error is raised here, in a ``then`` callback, so that torch marks the
        future *failed* (C++ ``setError``). ``Future.set_exception`` would not: it
        completes the future with the exception object as its value, which C++
        consumers cannot tell from a result: DDP's reducer extracts the tensors of
        that value by pickling it (a PicklingError where the class cannot be
        pickled) and takes the first of them (torch's ``parseCppCommHookResult``
        indexes an empty list when there is none: a crash in backward). Failed this
        way, DDP's backward raises torch's ``RuntimeError`` carrying unison's
        message (type, ranks, operation)."""
        if self._error is not None:
            raise self._error
        return self._tensors

    # --- torch's Work interface -------------------------------------------------------
    def wait(self, timeout: Any = None) -> bool:
        try:
            self._settle(_seconds(timeout))
        except E.CollectiveTimeoutError as exc:
            raise translate(exc) from None
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._finished:
            return True
        if all(p.is_completed() for p in self._parts):
            self._settle(None)
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self.is_completed() else None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._tensors

    def source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("source_rank is only available for recv from any source")
        self.wait()
        return self._source()

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()

    def on_finished(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the operation has finished, ok or failed, without anyone
        calling ``wait``; at once if it already has. It runs before the work counts as
        finished, so ``wait`` returns only after it has (the profiler ends its record
        this way), on whichever thread finishes the operation: it must not wait for
        this work."""
        with self._lock:
            pending = not self._finished
            if pending:
                self._when_finished.append(fn)
        if pending:
            self._arrange_settling()
        else:
            fn()

    def get_future(self) -> torch.futures.Future[Any]:
        """A future completed by whoever finishes the operation: the group's engine for
        collectives (callbacks, no thread), a waiter thread only for p2p requests, whose
        progress is made by waiting."""
        with self._lock:
            if self._future is not None:
                return self._future
            done = self._done = torch.futures.Future()
            fut = self._future = done.then(self._outcome)
            if self._finished:
                self._complete_future(done)
                return fut
        self._arrange_settling()
        return fut

    def _arrange_settling(self) -> None:
        """Have the operation settled when it completes, by the engine's completion
        callbacks for collectives, by a waiter thread for p2p requests (once)."""
        with self._lock:
            if self._settling_arranged or self._finished:
                return
            self._settling_arranged = True
        if all(p.pushed for p in self._parts):
            left = [len(self._parts)]

            def one_done(_: UWork) -> None:
                with self._lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    self._settle_quietly()  # every part is done: this does not block

            for p in self._parts:
                p.add_done_callback(one_done)
            if not self._parts:
                self._settle_quietly()
        else:
            threading.Thread(
                target=self._settle_quietly, name="unison-c10d-future", daemon=True
            ).start()

    def _settle_quietly(self) -> None:
        try:
            self._settle(None)
        except BaseException:  # the error is kept and handed to the future
            pass

    def __repr__(self) -> str:
        return f"<unison Work {self._name} {'done' if self._finished else 'pending'}>"


class DoneWork(dist._Work):  # type: ignore[misc, name-defined]
    """torch's Work of an operation that finished before the call returned (a blocking
    call that ran in the caller's thread): nothing to track, so nothing to set up
    (a fraction of :class:`UnisonWork`'s construction cost, per blocking call)."""

    __slots__ = ("_name", "_tensors")

    def __init__(self, name: str, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._name = name
        self._tensors = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._tensors

    def source_rank(self) -> int:
        raise RuntimeError("source_rank is only available for recv from any source")

    _source_rank = source_rank

    def synchronize(self) -> None:
        return None

    def on_finished(self, fn: Callable[[], None]) -> None:
        """Call ``fn()``: the operation has finished (see :meth:`UnisonWork.on_finished`)."""
        fn()

    def get_future(self) -> torch.futures.Future[Any]:
        fut: torch.futures.Future[Any] = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut

    def __repr__(self) -> str:
        return f"<unison Work {self._name} done>"


def done_work(name: str, result: list[torch.Tensor]) -> DoneWork:
    """A Work that has already finished (blocking calls, size-1 groups, empty operations)."""
    return DoneWork(name, result)
