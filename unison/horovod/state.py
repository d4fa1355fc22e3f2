"""The run state of one process set's engine, and the transitions that change it.

:class:`EngineState` is the one owner of everything the threads of an engine share:
the submitted and pending entries, the peers' cycle messages not yet used, the error,
the run claim (one thread at a time runs a cycle: the engine thread, a caller's
thread, the steady path), the promise that the next cycle is gathered, and the record
of who submitted what. Every transition takes the state's lock itself; callers never
hold it. Threads:

- user threads submit (:meth:`submit`, :meth:`claim_for_caller`, :meth:`claim_idle`);
- the channel's watcher delivers peers' messages (:meth:`deliver`, :meth:`peer_lost`);
- the thread holding the run claim runs the cycle (:meth:`begin_cycle`,
  :meth:`collect`, :meth:`decided`, :meth:`advance`) and gives the claim back
  (:meth:`release`);
- the engine thread waits for work (:meth:`await_work`).

Fields written only by the thread holding the run claim (:attr:`cycle`,
:attr:`gathered_next`, :attr:`ended`, :attr:`last_sent`) are read without the lock
elsewhere: a stale read costs one more look, never a message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..comm.work import Work
from .attendance import Attendance
from .cache import ResponseCache
from .errors import HorovodInternalError
from .handle import Entry, Handle
from .negotiation import Coordinator, RequestKind, Response

__all__ = ["NAME_HOLD_S", "EngineState"]

#: How long the name of a finished operation whose result the caller has not collected
#: (synchronize, or poll saying True) stays taken. Horovod's background thread takes
#: submissions once a cycle, so a name used again right after its first use is still
#: queued there: a duplicate. unison's engine may decide and run an operation at once,
#: inside the submitting call; the hold stands in for that queue. It is far longer than
#: a cycle because the reuse "right after" may come late on a busy host, where the
#: submitting thread can lose its core for milliseconds between two calls; a collected
#: result frees its name at once.
NAME_HOLD_S = 0.05


def _holds(h: Handle, now: float) -> bool:
    """Whether the operation of ``h`` still holds its name (see NAME_HOLD_S)."""
    return not h.collected and (not h.finished or now - h.finished_at < NAME_HOLD_S)


class EngineState:
    """See the module docstring. ``ranks``: the set's global ranks; ``me``: this
    rank's index in it; ``idle_answer_s``: how long a rank with nothing of its own may
    leave a peer's cycle unanswered."""

    def __init__(self, ranks: list[int], me: int, coord: Coordinator, idle_answer_s: float) -> None:
        self.ranks = ranks
        self.size = len(ranks)
        self.me = me
        self.coord = coord
        self.idle_answer_s = idle_answer_s
        #: answer a peer's cycle at once even with nothing pending (set where the
        #: channel cannot sleep on the transport's event: see NegotiationChannel.prompt)
        self.prompt = False
        self._cv = threading.Condition()
        self._new: list[Entry] = []
        self._pending: dict[str, Entry] = {}
        #: the handles of decided operations whose names are still held (see NAME_HOLD_S)
        self._held: dict[str, Handle] = {}
        self._inbox: dict[int, dict[int, Any]] = {}
        self._gone: set[int] = set()
        self._error: BaseException | None = None
        self._closing = False
        self._kick = False
        self._running = False
        self._arrived = 0.0  # when the first peer message of the next cycle arrived
        self._force: dict[str, str] = {}
        self._attendance = Attendance()
        #: the last cycle completed (written by the run claim's holder)
        self.cycle = 0
        #: every rank's last message said: the next cycle is gathered in one collective
        self.gathered_next = False
        #: when the last cycle ended, and when this rank last sent the peers anything
        self.ended = self.last_sent = time.monotonic()

    # --- reads ------------------------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        return self._error

    def has_work(self) -> bool:
        """Whether a peer's cycle message is wanted at once (read without the lock by
        the watcher: a stale answer costs one look later, never a message)."""
        return bool(self._pending or self._new or self._force or self.coord.busy)

    def missing(self, name: str, cache: ResponseCache) -> list[int] | None:
        """Set ranks (indices) that have not submitted ``name`` (None: unknown here)."""
        with self._cv:
            return self._attendance.missing(name, cache, self.size)

    def pending_names(self) -> list[str]:
        with self._cv:
            return sorted(self._pending)

    # --- submission -------------------------------------------------------------------------
    def _admit(self, entry: Entry) -> None:
        name = entry.request.name
        if self._error is not None:
            raise HorovodInternalError(
                f"cannot submit {name!r}: the engine failed earlier: {self._error}"
            ) from self._error
        if self._closing:
            raise HorovodInternalError(f"cannot submit {name!r}: Horovod has been shut down")
        held = self._held.get(name)
        if held is not None and not _holds(held, time.perf_counter()):
            del self._held[name]
            held = None
        queued = name in self._pending or any(e.request.name == name for e in self._new)
        if held is not None or queued:
            raise ValueError(
                f"a tensor named {name!r} is already being processed; names of pending "
                "operations must be unique (synchronize the earlier one first)"
            )
        self._new.append(entry)

    def submit(self, entry: Entry) -> None:
        """Queue ``entry`` for the engine thread."""
        with self._cv:
            self._admit(entry)
            self._cv.notify_all()

    def claim_for_caller(self, entry: Entry, cycle_time: float) -> bool:
        """Queue ``entry``; True when the engine is idle and the caller's thread now
        holds the run claim (it runs the cycle itself), False when the engine thread
        will take it."""
        with self._cv:
            self._admit(entry)
            if self._running or self._pending or len(self._new) > 1 or self._kick or cycle_time > 0:
                self._cv.notify_all()
                return False
            self._running = True
            return True

    def claim_idle(self) -> bool:
        """Take the run claim for a steady-path call: only when the next cycle is
        gathered and nothing at all is queued, pending, forced or failed."""
        with self._cv:
            if (
                not self.gathered_next
                or self._running
                or self._pending
                or self._new
                or self._kick
                or self._force
                or self._error is not None
                or self._closing
                or self.coord.busy
            ):
                return False
            self._running = True
            return True

    def add_pending(self, entry: Entry) -> None:
        """An entry the run claim's holder made itself (the steady path's fallback)."""
        with self._cv:
            self._pending[entry.request.name] = entry

    def release(self) -> None:
        """Give the run claim back; wake the engine thread if anything is left for it."""
        with self._cv:
            self._running = False
            if (
                self._new
                or self._pending
                or self._kick
                or self._error is not None
                or (self.cycle + 1) in self._inbox
            ):
                self._cv.notify_all()

    # --- the cycle (the run claim's holder) -------------------------------------------------
    def begin_cycle(self) -> list[Entry]:
        """Everything submitted becomes pending: the entries of the cycle starting now."""
        with self._cv:
            self._kick = False
            for e in self._new:
                self._pending[e.request.name] = e
            self._new = []
            return list(self._pending.values())

    def take_forced(self) -> dict[str, str]:
        """The stall inspector's shutdowns not yet announced (name: reason)."""
        with self._cv:
            force, self._force = self._force, {}
            return force

    def collect(
        self, k: int, need: list[int], posted: Callable[[], Work | None]
    ) -> tuple[dict[int, Any] | None, int, Work | None]:
        """Cycle ``k``'s messages from the set ranks ``need``: (all of them, or None and
        how many have come, with the receive the next one lands in). Raises the
        engine's error, or when a rank in ``need`` has said goodbye."""
        with self._cv:
            got = self._inbox.get(k, {})
            if all(r in got for r in need):
                return dict(self._inbox.pop(k, {})), len(got), None
            if self._error is not None:
                raise self._error
            gone = [self.ranks[r] for r in self._gone if r not in got and r in need]
            if gone:
                raise HorovodInternalError(
                    f"ranks {sorted(gone)} have shut down while rank "
                    f"{self.ranks[self.me]} still has operations pending: "
                    f"{sorted(self._pending)[:8]}",
                    ranks=gone,
                )
            # taken under the lock: the missing messages have not been delivered, so
            # they land in this receive
            return None, len(got), posted()

    def heard_from(self, k: int) -> set[int]:
        """The set ranks whose message of cycle ``k`` has come."""
        with self._cv:
            return set(self._inbox.get(k, {}))

    def record(self, msgs: dict[int, Any]) -> None:
        """One cycle's messages (every set rank's), for who-submitted-what."""
        with self._cv:
            self._attendance.record(msgs, self.size)

    def decided(self, responses: list[Response], now: float) -> list[Entry | None]:
        """Take the decided responses' entries off the pending table (None: this rank
        has no entry, it joined)."""
        with self._cv:
            local: list[Entry | None] = []
            for resp in responses:
                join = resp.request.kind is RequestKind.JOIN
                name = "__join__" if join else resp.name
                self._attendance.decided(name, join)
                e = self._pending.pop(name, None)
                if e is not None:
                    e.decided = now
                    self._held[name] = e.handle
                local.append(e)
            t = time.perf_counter()  # forget the names whose hold has passed
            self._held = {n: h for n, h in self._held.items() if _holds(h, t)}
            return local

    def all_decided(self, bits: bytes, name: str) -> None:
        """A steady cycle: every rank sent ``bits`` (naming ``name``), all decided."""
        with self._cv:
            self._attendance.all_sent(bits, name, self.size)

    def advance(self, k: int, gathered_next: bool) -> None:
        """Cycle ``k`` is decided; whether the next one is gathered."""
        self.cycle = k
        self.gathered_next = gathered_next

    def say_gone(self, ranks: list[int]) -> None:
        """Set ranks whose goodbye came in a gathered cycle's record."""
        with self._cv:
            self._gone.update(ranks)

    # --- messages from peers (cycle or watcher thread) ---------------------------------------
    def deliver(self, r: int, msg: Any, late: bool = False) -> None:
        """Set rank ``r``'s message; ``late``: the idle watcher found it on one of its
        looks, up to ``idle_answer_s`` after it came, so the answer is due now."""
        with self._cv:
            if msg == "ping":
                return
            if msg == "bye":
                self._gone.add(r)
            elif msg[0] == "C":
                if msg[1] not in self._inbox:
                    self._arrived = time.monotonic() - (self.idle_answer_s if late else 0.0)
                self._inbox.setdefault(msg[1], {})[r] = msg
            # a running cycle waits on the receives itself and whoever ends it wakes the
            # loop if more is wanted: only an idle loop needs the news
            if not self._running:
                self._cv.notify_all()

    def peer_lost(self, peer: int, exc: BaseException) -> None:
        """Global rank ``peer`` (-1: unknown) failed or went silent."""
        with self._cv:
            if self._error is None and not self._closing:
                who = f"rank {peer}" if peer >= 0 else "the peers"
                self._error = HorovodInternalError(
                    f"lost contact with {who}: {exc}", ranks=(peer,) if peer >= 0 else ()
                )
            self._cv.notify_all()

    # --- the engine thread's wait -----------------------------------------------------------
    def _linger(self) -> float:
        """Seconds to wait before answering a peer's cycle (0: now). With nothing of our
        own, the peer cannot use our answer before we submit, and submitting answers."""
        if self.has_work() or self.prompt:
            return 0.0
        return self._arrived + self.idle_answer_s - time.monotonic()

    def _wanted(self) -> bool:
        if self._running:
            return False
        if self._new or self._kick:
            return True
        if self.gathered_next:
            # every rank promised to enter the next cycle: a peer's message or goodbye
            # means it has; with nothing of our own we enter within idle_answer_s (the
            # point-to-point path's idle answer), so peers never wait past their deadline
            if (self.cycle + 1) in self._inbox or self._gone:
                return True
            return time.monotonic() - self.ended >= self.idle_answer_s
        return (self.cycle + 1) in self._inbox and self._linger() <= 0

    def await_work(
        self,
        idle_timeout: Callable[[], float],
        housekeeping: Callable[[float], dict[str, str]],
        cycle_time: float,
    ) -> bool:
        """The engine thread: wait until a cycle is wanted and take the run claim (True),
        or return False when the engine is closing. Raises the engine's error.
        ``housekeeping(now)`` runs after every idle wake-up and returns the stall
        inspector's new shutdowns (name: reason)."""
        with self._cv:
            while not self._wanted():
                if self._error is not None:
                    raise self._error
                if self._closing:
                    return False
                # at most idle_answer_s: a caller's cycle may have promised the next
                # one to the peers without waking this thread
                t = min(idle_timeout(), self.idle_answer_s)
                if not self._running and (self.cycle + 1) in self._inbox:
                    t = min(t, max(self._linger(), 1e-4))
                elif not self._running and self.gathered_next:
                    due = self.ended + self.idle_answer_s - time.monotonic()
                    t = min(t, max(due, 1e-4))
                self._cv.wait(t)
                for name, why in housekeeping(time.monotonic()).items():
                    if name not in self._force:
                        self._force[name] = why
                        self._kick = True
            if self._error is not None:
                raise self._error
            self._running = True
            if cycle_time > 0 and (self.cycle + 1) not in self._inbox:
                self._cv.wait(cycle_time)  # Horovod's cycle time: gather more tensors first
            return True

    # --- failure and shutdown ---------------------------------------------------------------
    def fail(self, exc: BaseException) -> BaseException:
        """The engine failed: remember the first error; fail every entry with it. Returns
        the error the engine keeps."""
        if not isinstance(exc, HorovodInternalError):
            err: BaseException = HorovodInternalError(f"the engine failed: {exc!r}")
            err.__cause__ = exc
        else:
            err = exc
        with self._cv:
            if self._error is None:
                self._error = err
            kept = self._error
            entries = list(self._pending.values()) + self._new
            self._pending.clear()
            self._new = []
        for e in entries:
            e.handle.finish(error=err)
        return kept

    def close(self) -> None:
        """No more submissions; the engine thread returns."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def claim_goodbye(self) -> bool:
        """After :meth:`close` (the engine thread gone): take the run claim when every
        peer was promised this rank's next cycle, to enter it with a goodbye."""
        with self._cv:
            enter = self.gathered_next and self._error is None and not self._running
            self._running = self._running or enter
            return enter

    def drain(self) -> list[Entry]:
        """Every entry not yet finished (taken off the tables)."""
        with self._cv:
            entries = list(self._pending.values()) + self._new
            self._pending.clear()
            self._new = []
            return entries
