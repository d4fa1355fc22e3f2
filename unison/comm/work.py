"""``Work``: the handle of an operation in flight (torch.distributed's name).

Every engine returns a :class:`Work`; they differ only in how the operation makes
progress, which the engine passes in as ``progress`` (see :class:`Work`). The one
wait loop (:meth:`Work._wait_done`) serves them all: a caller's timeout, bounded
progress steps, and a back-off between polls of engines that can only be tested,
so no wait ever busy-spins or outlives its deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._completion import Completion
from ..errors import CollectiveTimeoutError

if TYPE_CHECKING:
    from ..transport.request import Request

__all__ = ["Progress", "Work", "joined"]

#: ``progress(work, budget)``: drive or test the operation for at most ``budget``
#: seconds (None: the caller waits without a timeout), finishing ``work``
#: (:meth:`Work.finish`) when the operation ends, its own deadline included;
#: returns whether ``work`` is finished.
Progress = Callable[["Work", "float | None"], bool]

_SPIN_S = 2e-3  # polled engines: yield between tests this long, then back off
_PAUSE_MIN_S = 5e-5
_PAUSE_MAX_S = 1e-3
_CALLBACKS = threading.Lock()  # guards every Work's list of done callbacks


def _pushed(work: Work, budget: float | None) -> bool:
    """Progress of an operation another thread finishes: sleep until it does."""
    return work.wait_finished(budget)


class Work:
    """An asynchronous operation.

    ``wait(timeout=None)`` blocks until the operation finishes and re-raises its
    error; with a timeout it raises :class:`CollectiveTimeoutError` if the
    operation has not finished by then (the operation itself goes on until its
    own deadline). ``is_completed()`` and ``exception()`` never block.

    Engines make one with ``launch(caller_waits)`` (starts it; the shared layer calls it
    once) and/or ``progress`` (:data:`Progress`; default: another thread calls
    :meth:`finish`). ``polled``: ``progress`` only tests and returns at once, so the
    wait loop yields, then backs off from 50 µs to 1 ms, between calls.
    """

    def __init__(
        self,
        name: str,
        launch: Callable[[bool], None] | None = None,
        *,
        progress: Progress | None = None,
        polled: bool = False,
        result: Any = None,
    ) -> None:
        self.name = name
        #: starts the operation (``launch(caller_waits)``); None once started or if it runs already
        self._launch = launch
        self._progress: Progress = _pushed if progress is None else progress
        self._polled = polled
        self._state = Completion()
        self._result: Any = result
        #: the sender of a receive (a global rank), once it finished; None otherwise
        self.source: int | None = None
        #: the transport request underneath a native point-to-point operation (None
        #: elsewhere); the transport's own thread completes it (see :meth:`wait_quiet`)
        self.request: Request | None = None
        #: the buffers the operation writes (set by the shared layer): :meth:`result`
        self.outputs: list[Any] | None = None

    # --- start and completion (called by the shared layer and the engine) -----------
    def start(self, caller_waits: bool) -> None:
        """Start the operation if it has not started: ``caller_waits`` (the caller waits
        on it at once) lets an idle engine run it in the caller's thread."""
        launch = self._launch
        if launch is not None:
            self._launch = None
            launch(caller_waits)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """End the operation (the first call wins); the engine calls it."""
        if not self._state.done():
            self._result = result
        if self._state.complete(error):
            with _CALLBACKS:
                callbacks = self.__dict__.pop("_callbacks", ())
            for fn in callbacks:
                fn(self)

    def wait_finished(self, timeout: float | None) -> bool:
        """Sleep until another thread finishes the operation (True) or ``timeout`` passes."""
        return self._state.wait_done(timeout)

    def add_done_callback(self, fn: Callable[[Work], None]) -> None:
        """Run ``fn(self)`` once the operation finishes, on the thread that finishes it
        (here and now if it has). Only an operation another thread finishes (see
        :attr:`pushed`) calls it unasked; the others finish while someone waits."""
        with _CALLBACKS:
            if not self._state.done():
                self.__dict__.setdefault("_callbacks", []).append(fn)
                return
        fn(self)

    @property
    def pushed(self) -> bool:
        """True when the engine finishes the operation from its own thread."""
        return self._progress is _pushed

    @property
    def finished(self) -> bool:
        """Whether the operation has ended (without driving it, unlike :meth:`is_completed`)."""
        return self._state.done()

    def _wait_done(self, timeout: float | None) -> bool:
        """The one wait loop: True once finished, False if ``timeout`` passed first."""
        if self._state.done():
            return True
        self.start(False)
        now = time.monotonic()
        end = None if timeout is None else now + timeout
        spin_until = now + _SPIN_S
        pause = 0.0
        while True:
            left = None if end is None else max(end - now, 0.0)
            if self._progress(self, left) or self._state.done():
                return True
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            if self._polled:
                time.sleep(pause)  # sleep(0) yields the processor
                if now >= spin_until:
                    pause = min(max(pause * 2, _PAUSE_MIN_S), _PAUSE_MAX_S)
                now = time.monotonic()

    # --- public ------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the operation's error. Returns True."""
        if not self._wait_done(timeout):
            raise CollectiveTimeoutError(
                f"{self.name} did not complete within {timeout:g}s (Work.wait timeout)",
                op=self.name,
            )
        if self._state.error is not None:
            raise self._state.error
        return True

    def wait_quiet(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the operation to finish; returns whether it
        did. Never raises the operation's error (:meth:`wait` and :meth:`exception` do).

        Over a transport request that the transport's own thread completes (native
        point-to-point), the wait sleeps on that request's event instead of driving the
        transport, so another thread may drive it meanwhile."""
        if self._state.done():
            return True
        req = self.request
        if req is not None:
            req.wait_done(timeout)
            return self._wait_done(0)
        return self._wait_done(timeout)

    def is_completed(self) -> bool:
        return self._wait_done(0)

    def is_success(self) -> bool:
        return self.is_completed() and self._state.error is None

    def exception(self) -> BaseException | None:
        """The error the operation failed with, or None (also while it runs)."""
        return self._state.error if self.is_completed() else None

    def result(self) -> Any:
        """The operation's output buffers as a list, as torch's ``Work.result()``: the
        reduced or broadcast buffer (``[tensor]``), every gathered block, the received
        buffer; ``[]`` for a barrier or where this rank receives nothing. Waits first."""
        self.wait()
        if self.outputs is not None:
            return list(self.outputs)
        return self._result  # an operation of another layer's own (unison.ps: its reply)

    def __repr__(self) -> str:
        state = "pending" if not self.is_completed() else ("failed" if self.exception() else "done")
        return f"<Work {self.name} {state}>"


def joined(name: str, parts: Sequence[Work], result: Any = None) -> Work:
    """One operation made of ``parts``: it finishes when every part has, failing with
    the first part's error, else with ``result``."""
    parts = list(parts)

    def progress(work: Work, budget: float | None) -> bool:
        end = None if budget is None else time.monotonic() + budget
        for p in parts:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not p._wait_done(left):  # the one wait loop, of this module's own class
                return False
        err = next((e for e in (p.exception() for p in parts) if e is not None), None)
        work.finish(result, err)
        return True

    return Work(name, progress=progress)
