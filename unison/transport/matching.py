"""Tag matching shared by every transport.

Messages from one peer with one key (kind, group, seq, tag) are delivered in the
order they were sent; different keys are matched independently. A message that
arrives before its receive is posted is kept as an *unexpected* message (a copy)
until the receive is posted.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from .framing import OpSig
from .request import Request

__all__ = ["Matcher", "Unexpected"]

Key = tuple[int, int, int, int]


class Unexpected:
    __slots__ = ("data", "sig")

    def __init__(self, data: bytearray, sig: OpSig) -> None:
        self.data = data
        self.sig = sig


#: Called when a message meets its receive: (request, sender's signature, payload or None).
Deliver = Callable[[Request, OpSig, np.ndarray | None], None]


class Matcher:
    """Posted receives and unexpected messages, per (peer, key), under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: dict[tuple[int, Key], deque[Request]] = {}
        self._unexpected: dict[tuple[int, Key], deque[Unexpected]] = {}

    def post(self, req: Request) -> Unexpected | None:
        """Post a receive; returns an unexpected message it matches at once, if any."""
        slot = (req.peer, req.key)
        with self._lock:
            queue = self._unexpected.get(slot)
            if queue:
                msg = queue.popleft()
                if not queue:
                    del self._unexpected[slot]
                return msg
            self._posted.setdefault(slot, deque()).append(req)
            return None

    def take_posted(self, peer: int, key: Key) -> Request | None:
        """The oldest receive posted for this message, removed; None if none is."""
        slot = (peer, key)
        with self._lock:
            queue = self._posted.get(slot)
            if not queue:
                return None
            req = queue.popleft()
            if not queue:
                del self._posted[slot]
            return req

    def add_unexpected(self, peer: int, key: Key, msg: Unexpected) -> Request | None:
        """Store a message that had no receive; if one was posted meanwhile, return it."""
        slot = (peer, key)
        with self._lock:
            queue = self._posted.get(slot)
            if queue:
                req = queue.popleft()
                if not queue:
                    del self._posted[slot]
                return req
            self._unexpected.setdefault(slot, deque()).append(msg)
            return None

    def cancel(self, req: Request) -> None:
        slot = (req.peer, req.key)
        with self._lock:
            queue = self._posted.get(slot)
            if queue and req in queue:
                queue.remove(req)
                if not queue:
                    del self._posted[slot]

    def drop_peer(self, peer: int) -> list[Request]:
        """Remove and return every receive posted for ``peer``."""
        with self._lock:
            out: list[Request] = []
            for slot in [s for s in self._posted if s[0] == peer]:
                out.extend(self._posted.pop(slot))
            return out

    def drop_group_seq(self, group: int, seq: int) -> None:
        """Forget unexpected messages of one finished or aborted operation."""
        with self._lock:
            for slot in [s for s in self._unexpected if s[1][1] == group and s[1][2] == seq]:
                del self._unexpected[slot]

    def unexpected_sigs(self, group: int, seq: int) -> list[tuple[int, OpSig]]:
        """(peer, sender signature) of buffered messages of one operation."""
        if not self._unexpected:  # the common case, without taking the lock
            return []
        with self._lock:
            return [
                (slot[0], msg.sig)
                for slot, queue in self._unexpected.items()
                if slot[1][1] == group and slot[1][2] == seq
                for msg in queue
            ]

    def pending_unexpected(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._unexpected.values())
