"""A pending send or receive: completes once, with success or an exception."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .framing import OpSig

__all__ = ["Request"]

#: guards the done flag and the lazily made event of every request (held for a few
#: instructions; cheaper than a Condition per message)
_LOCK = threading.Lock()


class Request:
    """One message in flight to or from ``peer`` (a global rank).

    ``wait(timeout)`` returns True when done (raising the failure, if any) and
    False when the timeout passed first. Completion is signalled through a
    ``threading.Event``, so waiters block instead of polling.
    """

    __slots__ = ("_done", "_error", "_event", "key", "nbytes", "peer", "sender_sig", "sig", "view")

    def __init__(
        self, peer: int, key: tuple[int, int, int, int], view: np.ndarray | None, sig: OpSig
    ) -> None:
        self.peer = peer
        self.key = key
        self.view = view  # uint8 destination (recv) or source (send)
        self.nbytes = 0 if view is None else int(view.nbytes)
        self.sig = sig
        self.sender_sig: OpSig | None = None
        self._done = False
        self._event: threading.Event | None = None  # made only if someone must block
        self._error: BaseException | None = None

    def complete(self, error: BaseException | None = None) -> bool:
        """Finish the request; returns False if it had already finished."""
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

    def wait(self, timeout: float | None) -> bool:
        if not self.wait_done(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def __repr__(self) -> str:
        state: Any = "done" if self.done() else "pending"
        return f"Request(peer={self.peer}, key={self.key}, nbytes={self.nbytes}, {state})"
