"""The TCP store's state machine: keys, counters and parked requests. No I/O.

:meth:`KVState.request` answers a decoded request at once (a :data:`Reply`) or parks
it (a :class:`Parked`). Answers owed to parked requests - released by a later set or
by their deadline - accumulate and are collected with :meth:`KVState.take_completed`.
The server thread is the only caller, except :meth:`KVState.get`, which is locked for
in-process readers such as the launcher.
"""

from __future__ import annotations

import heapq
import itertools
import threading

from . import protocol as p

__all__ = ["KVState", "Parked", "Reply"]

Reply = tuple[p.StoreStatus, list[bytes]]
_OK: p.StoreStatus = p.StoreStatus.OK


class Parked:
    """A get/wait waiting for keys; ``owner`` is the server's connection object."""

    __slots__ = ("deadline", "done", "keys", "missing", "op", "owner")

    def __init__(self, owner: object, op: p.StoreOp, keys: list[str], deadline: float) -> None:
        self.owner = owner
        self.op = op
        self.keys = keys
        self.missing = set(keys)
        self.deadline = deadline
        self.done = False


class KVState:
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Parked]] = {}
        self._heap: list[tuple[float, int, Parked]] = []
        self._seq = itertools.count()
        self._completed: list[tuple[Parked, Reply]] = []

    # -- readers ----------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def parked_count(self) -> int:
        return sum(1 for _, _, w in self._heap if not w.done)

    def next_deadline(self) -> float | None:
        while self._heap and self._heap[0][2].done:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def take_completed(self) -> list[tuple[Parked, Reply]]:
        done, self._completed = self._completed, []
        return done

    # -- requests ---------------------------------------------------------------------
    def request(self, owner: object, op: p.StoreOp, f: list[bytes], now: float) -> Reply | Parked:
        """Answer or park one request; raises :class:`~.protocol.ProtocolError` if malformed."""
        if op is p.StoreOp.PING:
            return _OK, []
        if op is p.StoreOp.SET:
            _arity(op, f, 2)
            self._store(p.parse_key(f[0]), f[1])
            return _OK, []
        if op is p.StoreOp.GET:
            _arity(op, f, 2)
            key, timeout = p.parse_key(f[0]), p.parse_f64(f[1])
            value = self.get(key)
            if value is not None:
                return _OK, [value]
            return self._park(owner, op, [key], timeout, now)
        if op is p.StoreOp.ADD:
            _arity(op, f, 2)
            return self._add(p.parse_key(f[0]), p.parse_i64(f[1]))
        if op is p.StoreOp.CAS:
            _arity(op, f, 3)
            return self._cas(p.parse_key(f[0]), f[1], f[2])
        if op is p.StoreOp.WAIT:
            if not f:
                raise p.ProtocolError("WAIT needs a timeout field")
            timeout = p.parse_f64(f[0])
            keys = [p.parse_key(k) for k in f[1:]]
            with self._lock:
                missing = [k for k in keys if k not in self._data]
            return self._park(owner, op, missing, timeout, now) if missing else (_OK, [])
        if op is p.StoreOp.CHECK:
            keys = [p.parse_key(k) for k in f]
            with self._lock:
                present = all(k in self._data for k in keys)
            return _OK, [b"\x01" if present else b"\x00"]
        if op is p.StoreOp.DELETE:
            _arity(op, f, 1)
            with self._lock:
                existed = self._data.pop(p.parse_key(f[0]), None) is not None
            return _OK, [b"\x01" if existed else b"\x00"]
        if op is p.StoreOp.NUM_KEYS:
            with self._lock:
                return _OK, [p.i64(len(self._data))]
        raise p.ProtocolError(f"unhandled op {op!r}")  # pragma: no cover

    def _store(self, key: str, value: bytes) -> None:
        with self._lock:
            self._data[key] = value
        for waiter in list(self._waiters.get(key, ())):
            waiter.missing.discard(key)
            if not waiter.missing:
                self._complete(waiter, (_OK, [value] if waiter.op is p.StoreOp.GET else []))

    def _add(self, key: str, amount: int) -> Reply:
        try:
            new = int((self.get(key) or b"0").decode("ascii")) + amount
        except (UnicodeDecodeError, ValueError):
            return p.StoreStatus.ERROR, [f"value of {key!r} is not an integer".encode()]
        if not -(1 << 63) <= new < (1 << 63):
            return p.StoreStatus.ERROR, [f"counter {key!r} overflows int64".encode()]
        self._store(key, str(new).encode())
        return _OK, [p.i64(new)]

    def _cas(self, key: str, expected: bytes, desired: bytes) -> Reply:
        current = self.get(key)
        if (current is None and expected == b"") or (current is not None and current == expected):
            self._store(key, desired)
            return _OK, [desired]
        return _OK, [expected if current is None else current]

    # -- parking ----------------------------------------------------------------------
    def _park(
        self, owner: object, op: p.StoreOp, keys: list[str], timeout: float, now: float
    ) -> Reply | Parked:
        if timeout <= 0:
            return p.StoreStatus.TIMEOUT, [k.encode() for k in keys]
        waiter = Parked(owner, op, keys, now + min(timeout, 1e9))
        for k in keys:
            self._waiters.setdefault(k, set()).add(waiter)
        heapq.heappush(self._heap, (waiter.deadline, next(self._seq), waiter))
        return waiter

    def expire(self, now: float) -> None:
        """Time out every parked request whose deadline has passed."""
        while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
            _, _, waiter = heapq.heappop(self._heap)
            if not waiter.done:
                missing = [k.encode() for k in waiter.keys if k in waiter.missing]
                self._complete(waiter, (p.StoreStatus.TIMEOUT, missing))

    def cancel(self, waiter: Parked) -> None:
        """Forget a parked request (its connection went away)."""
        waiter.done = True
        for k in waiter.keys:
            group = self._waiters.get(k)
            if group is not None:
                group.discard(waiter)
                if not group:
                    del self._waiters[k]

    def _complete(self, waiter: Parked, reply: Reply) -> None:
        self.cancel(waiter)
        self._completed.append((waiter, reply))


def _arity(op: p.StoreOp, fields: list[bytes], n: int) -> None:
    if len(fields) != n:
        raise p.ProtocolError(f"{op.name} takes {n} fields, got {len(fields)}")
