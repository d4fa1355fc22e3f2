"""A pending send or receive: completes once, with success or an exception."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .framing import OpSig

__all__ = ["Request"]


class Request:
    """One message in flight to or from ``peer`` (a global rank).

    ``wait(timeout)`` returns True when done (raising the failure, if any) and
    False when the timeout passed first. Completion is signalled through a
    ``threading.Event``, so waiters block instead of polling.
    """

    __slots__ = ("_error", "_event", "key", "nbytes", "peer", "sender_sig", "sig", "view")

    def __init__(
        self, peer: int, key: tuple[int, int, int, int], view: np.ndarray | None, sig: OpSig
    ) -> None:
        self.peer = peer
        self.key = key
        self.view = view  # uint8 destination (recv) or source (send)
        self.nbytes = 0 if view is None else int(view.nbytes)
        self.sig = sig
        self.sender_sig: OpSig | None = None
        self._event = threading.Event()
        self._error: BaseException | None = None

    def complete(self, error: BaseException | None = None) -> bool:
        """Finish the request; returns False if it had already finished."""
        if self._event.is_set():
            return False
        self._error = error
        self._event.set()
        return True

    def done(self) -> bool:
        return self._event.is_set()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait(self, timeout: float | None) -> bool:
        if not self._event.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def __repr__(self) -> str:
        state: Any = "done" if self.done() else "pending"
        return f"Request(peer={self.peer}, key={self.key}, nbytes={self.nbytes}, {state})"
