"""Tag matching shared by every transport.

Messages from one peer with one key (kind, group, seq, tag) are delivered in the
order they were sent; different keys are matched independently. A message that
arrives before its receive is posted is kept as an *unexpected* message (a copy)
until the receive is posted.

Any-source receives (``peer == ANY_SOURCE``, MPI's ``MPI_ANY_SOURCE``) take the next
message with their key from whichever peer. Guarantees, as MPI states them:

* messages from one sender with one key are still received in the order sent;
* an any-source receive takes the buffered message that arrived first (arrival
  order at this rank), and a message that arrives finds the receive posted first
  among those that can take it (any-source and specific receives of that peer,
  in posting order);
* between different senders no order exists beyond arrival order (as in MPI).

A matched any-source request has its ``peer`` set to the sender.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from .._types import OpSig
from .request import Request

__all__ = ["ANY_SOURCE", "Matcher", "Unexpected"]

Key = tuple[int, int, int, int]

#: the ``peer`` of a receive that takes a message from any sender
ANY_SOURCE = -1


class Unexpected:
    __slots__ = ("data", "order", "sig")

    def __init__(self, data: bytearray, sig: OpSig) -> None:
        self.data = data
        self.sig = sig
        self.order = 0  # arrival stamp, set when buffered


#: Called when a message meets its receive: (request, sender's signature, payload or None).
Deliver = Callable[[Request, OpSig, np.ndarray | None], None]


class AnySource:
    """What the matchers of one process share for any-source receives: one lock, the
    any-source receives waiting (by key, with posting stamps), the stamps of specific
    receives posted while any wait, the arrival clock and the matchers themselves."""

    __slots__ = ("clock", "lock", "matchers", "stamps", "waiting")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[Key, deque[tuple[int, Request]]] = {}
        self.stamps: dict[int, int] = {}  # id(request) -> posting stamp
        self.clock = itertools.count(1)
        self.matchers: list[Matcher] = []


class Matcher:
    """Posted receives and unexpected messages, per (peer, key), under one lock."""

    def __init__(self) -> None:
        self._posted: dict[tuple[int, Key], deque[Request]] = {}
        self._unexpected: dict[tuple[int, Key], deque[Unexpected]] = {}
        self._use(AnySource())

    def _use(self, shared: AnySource) -> None:
        #: the any-source state this matcher takes part in
        self.any_source = shared
        shared.matchers.append(self)
        # posting stamps, kept only while any-source receives are pending (the common,
        # specific-only case pays nothing)
        self._lock = shared.lock
        self._any = shared.waiting
        self._stamp = shared.stamps
        self._clock = shared.clock
        #: matchers whose messages any-source receives posted here can take
        self._group = shared.matchers

    def share_any_source(self, other: Matcher) -> None:
        """Join ``other``'s any-source matching (one lock, one any-source queue): a
        transport's matcher joins the first one before it carries any message, so an
        any-source receive sees the messages of every transport's peers."""
        self.any_source.matchers.remove(self)
        self._use(other.any_source)

    def oldest_unexpected(self, key: Key) -> tuple[int, tuple[int, Key]] | None:
        """(arrival stamp, slot) of the earliest buffered message with ``key`` from any
        peer (the shared lock held)."""
        best: tuple[int, tuple[int, Key]] | None = None
        for slot, queue in self._unexpected.items():
            if slot[1] == key and (best is None or queue[0].order < best[0]):
                best = (queue[0].order, slot)
        return best

    def pop_unexpected(self, slot: tuple[int, Key]) -> Unexpected:
        """The first buffered message of ``slot``, removed (the shared lock held)."""
        queue = self._unexpected[slot]
        msg = queue.popleft()
        if not queue:
            del self._unexpected[slot]
        return msg

    # --- posting ---------------------------------------------------------------------
    def post(self, req: Request) -> Unexpected | None:
        """Post a receive; returns an unexpected message it matches at once, if any.

        For an any-source receive that matched, ``req.peer`` is now the sender.
        """
        with self._lock:
            if req.peer == ANY_SOURCE:
                return self._post_any(req)
            slot = (req.peer, req.key)
            queue = self._unexpected.get(slot)
            if queue:
                msg = queue.popleft()
                if not queue:
                    del self._unexpected[slot]
                return msg
            self._posted.setdefault(slot, deque()).append(req)
            if self._any:
                self._stamp[id(req)] = next(self._clock)
            return None

    def _post_any(self, req: Request) -> Unexpected | None:
        best: tuple[int, Matcher, tuple[int, Key]] | None = None
        for m in self._group:
            found = m.oldest_unexpected(req.key)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], m, found[1])
        if best is not None:
            _, m, slot = best
            req.peer = slot[0]
            return m.pop_unexpected(slot)
        self._any.setdefault(req.key, deque()).append((next(self._clock), req))
        return None

    # --- arrivals ----------------------------------------------------------------------
    def _take(self, peer: int, key: Key) -> Request | None:
        """The receive that gets a message from ``peer`` now (lock held), removed."""
        slot = (peer, key)
        queue = self._posted.get(slot)
        anyq = self._any.get(key) if self._any else None
        if anyq and (not queue or anyq[0][0] < self._stamp.get(id(queue[0]), 0)):
            _, req = anyq.popleft()
            if not anyq:
                del self._any[key]
            req.peer = peer
            if not self._any:
                self._stamp.clear()
            return req
        if not queue:
            return None
        req = queue.popleft()
        if not queue:
            del self._posted[slot]
        if self._stamp:
            self._stamp.pop(id(req), None)
        return req

    def take_posted(self, peer: int, key: Key) -> Request | None:
        """The oldest receive posted for this message, removed; None if none is."""
        with self._lock:
            return self._take(peer, key)

    def add_unexpected(self, peer: int, key: Key, msg: Unexpected) -> Request | None:
        """Store a message that had no receive; if one was posted meanwhile, return it."""
        with self._lock:
            req = self._take(peer, key)
            if req is not None:
                return req
            msg.order = next(self._clock)
            self._unexpected.setdefault((peer, key), deque()).append(msg)
            return None

    # --- withdrawal ----------------------------------------------------------------------
    def cancel(self, req: Request) -> None:
        with self._lock:
            anyq = self._any.get(req.key)
            if anyq:
                for item in anyq:
                    if item[1] is req:
                        anyq.remove(item)
                        if not anyq:
                            del self._any[req.key]
                        return
            slot = (req.peer, req.key)
            queue = self._posted.get(slot)
            if queue and req in queue:
                queue.remove(req)
                self._stamp.pop(id(req), None)
                if not queue:
                    del self._posted[slot]

    def drop_peer(self, peer: int) -> list[Request]:
        """Remove and return every receive posted for ``peer`` (any-source ones stay)."""
        with self._lock:
            out: list[Request] = []
            for slot in [s for s in self._posted if s[0] == peer]:
                out.extend(self._posted.pop(slot))
            for req in out:
                self._stamp.pop(id(req), None)
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
