"""Something that completes once, with success or an error, and can be waited for.

The one completion cell under :class:`unison.comm.work.Work` (the public future)
and :class:`unison.transport.request.Request` (one message in flight). Completion
is signalled through a ``threading.Event`` made only when someone must block, so
waiters sleep instead of polling and a request nobody waits on costs no event.
"""

from __future__ import annotations

import threading

__all__ = ["Completion"]

#: guards the done flag and the lazily made event of every completion (held for a few
#: instructions; cheaper than a Condition per message)
_LOCK = threading.Lock()


class Completion:
    __slots__ = ("_done", "_error", "_event")

    def __init__(self) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._event: threading.Event | None = None  # made only if someone must block

    def complete(self, error: BaseException | None = None) -> bool:
        """Finish; returns False (and changes nothing) if it had already finished."""
        with _LOCK:
            if self._done:
                return False
            self._error = error
            self._done = True
            event = self._event
        if event is not None:
            event.set()
        return True

    def done(self) -> bool:
        return self._done

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait_done(self, timeout: float | None) -> bool:
        """Block until finished (without raising); False if the timeout passed first."""
        if self._done:
            return True
        with _LOCK:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)
