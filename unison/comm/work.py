"""``Work``: the handle of an operation in flight (torch.distributed's name)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveTimeoutError

__all__ = ["Work"]

_LOCK = threading.Lock()  # guards each Work's done flag and its lazily made event


class Work:
    """An asynchronous operation.

    ``wait(timeout=None)`` blocks until the operation finishes and re-raises its
    error; with a timeout it raises :class:`CollectiveTimeoutError` if the
    operation has not finished by then (the operation itself goes on until its
    own deadline). ``is_completed()`` and ``exception()`` never block.
    """

    def __init__(self, name: str, launch: Callable[[bool], None] | None = None) -> None:
        self.name = name
        #: starts the operation (``launch(inline)``); None once started or if it runs already
        self._launch = launch
        self._done = False
        self._event: threading.Event | None = None  # made only if someone must block
        self._error: BaseException | None = None
        self._result: Any = None

    # --- start and completion (called by the shared layer and the engine) -----------
    def _start(self, inline: bool) -> None:
        """Start the operation if it has not started: ``inline`` lets an idle engine run a
        call that will be waited on at once in the caller's thread."""
        launch = self._launch
        if launch is not None:
            self._launch = None
            launch(inline)

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        with _LOCK:
            self._result = result
            self._error = error
            self._done = True
            event = self._event
            callbacks = self.__dict__.pop("_callbacks", ())
        if event is not None:
            event.set()
        for fn in callbacks:
            fn(self)

    def add_done_callback(self, fn: Callable[[Work], None]) -> None:
        """Run ``fn(self)`` once the operation finishes, on the thread that finishes it
        (here and now if it has). Only an operation an engine finishes calls it unasked;
        a point-to-point request finishes when someone waits on it."""
        with _LOCK:
            if not self._done:
                self.__dict__.setdefault("_callbacks", []).append(fn)
                return
        fn(self)

    def _wait_done(self, timeout: float | None) -> bool:
        if self._done:
            return True
        if self._launch is not None:
            self._start(False)
        with _LOCK:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    # --- public ------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the operation's error. Returns True."""
        if not self._wait_done(timeout):
            raise CollectiveTimeoutError(
                f"{self.name} did not complete within {timeout:g}s (Work.wait timeout)",
                op=self.name,
            )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._wait_done(0)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The error the operation failed with, or None (also while it runs)."""
        return self._error if self.is_completed() else None

    def result(self) -> Any:
        """What the operation produced (after :meth:`wait`), e.g. the buffers it filled."""
        self.wait()
        return self._result

    def __repr__(self) -> str:
        state = "pending" if not self.is_completed() else ("failed" if self._error else "done")
        return f"<Work {self.name} {state}>"
