"""A pending send or receive: completes once, with success or an exception."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._completion import Completion
from .._types import OpSig

__all__ = ["Request"]


class Request(Completion):
    """One message in flight to or from ``peer`` (a global rank).

    ``wait(timeout)`` returns True when done (raising the failure, if any) and
    False when the timeout passed first (:class:`~unison._completion.Completion`: waiters
    block on an event instead of polling).
    """

    __slots__ = ("key", "nbytes", "peer", "sender_sig", "sig", "view")

    def __init__(
        self, peer: int, key: tuple[int, int, int, int], view: np.ndarray | None, sig: OpSig
    ) -> None:
        self.peer = peer
        self.key = key
        self.view = view  # uint8 destination (recv) or source (send)
        self.nbytes = 0 if view is None else int(view.nbytes)
        self.sig = sig
        self.sender_sig: OpSig | None = None
        super().__init__()

    def wait(self, timeout: float | None) -> bool:
        if not self.wait_done(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def __repr__(self) -> str:
        state: Any = "done" if self.done() else "pending"
        return f"Request(peer={self.peer}, key={self.key}, nbytes={self.nbytes}, {state})"
