"""The background engine of one process set: negotiate, then execute in one order.

One thread per process set and rank, woken when work is submitted or a peer
starts a negotiation cycle — never paced by a sleep. A cycle: every rank sends
every peer one small message (the response-cache bits of its pending tensors,
full requests for tensors not in the cache, and from rank 0 the tensors its stall
inspector shuts down) and receives theirs. When only cached tensors are involved
the bitwise AND of the bit vectors decides. Otherwise every rank feeds the same
requests, in rank order, into its own copy of the coordinator's table
(:class:`Coordinator`), which validates them and yields the same responses on
every rank — no round trip to rank 0. Then every rank executes the same responses
in the same order (:mod:`unison.torch.execute`).

A cycle starts when there is new local work or a peer's message for it has
arrived, so ranks that submit in different orders meet without polling. A rank with
work pending answers a peer's cycle at once; a rank with nothing of its own answers
within ``TorchEngine.idle_answer_s`` (its own submission starts the cycle that pairs
with the peer's), so no timing constant is involved. Between cycles one watcher thread
waits on the peers' messages while this rank has work pending
(:mod:`unison.torch.channel`).

Steady state: when every rank's message of a cycle was pure response-cache traffic
that fits a fixed-size record and the cycle decided all of it (the same bits from every
rank: nobody is left with anything pending), every rank knows the next cycle is
*gathered*: each
rank packs its message into a record and one all_gather on the set's data group (the
native engine's slot lane) hands every rank every message — no pickling, no
point-to-point wake-ups (:mod:`unison.torch.record`). A message that does not fit
travels point to point and its record says so. Every rank was promised the gathered
cycle, so whoever runs it enters it: a caller, the engine thread for an async
submission or a peer's message, an idle rank within ``idle_answer_s`` (as its idle
answer), and :meth:`TorchEngine.close` with its goodbye.

The fast path for the caller: a blocking call (``hvd.allreduce`` ...) made while
the engine is idle (nothing queued or pending, no cycle running) runs the cycle
on the caller's thread (:meth:`TorchEngine.run_blocking`) and waits on the peers'
receives itself (:meth:`NegotiationChannel.pull`): a cached small all-reduce then completes
without a thread hand-off. The cycle is the same on either thread (one runs at a
time, in order), so peers cannot tell the difference. In steady state a named small
all-reduce goes further: :class:`~unison.torch.steady.SteadyPath` runs its gathered cycle
from a per-name record template, with no handle, entry or message tuples, and falls back
to the general decision when any rank's record differs.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

from ..comm.api import Group
from .attendance import Attendance
from .cache import ResponseCache
from .channel import NegotiationChannel
from .cycle import run_cycle
from .errors import HorovodInternalError
from .exchange import execute, gather
from .execute import Executor
from .handle import Entry
from .negotiation import Coordinator, Response
from .record import LaneCycles
from .settings import Settings
from .stall import StallInspector
from .steady import SteadyPath
from .timeline import Timeline

__all__ = ["TorchEngine"]


log = logging.getLogger("unison.torch")


class TorchEngine:
    def __init__(
        self,
        ranks: list[int],
        me_global: int,
        ctl: Group,
        data: Group,
        settings: Settings,
        timeline: Timeline | None,
    ) -> None:
        self.ranks = ranks
        self.size = len(ranks)
        self.me = ranks.index(me_global)
        self.settings = settings
        self.timeline = timeline
        self._cv = threading.Condition()
        self._new: list[Entry] = []
        self._pending: dict[str, Entry] = {}
        self._inbox: dict[int, dict[int, Any]] = {}
        self._gone: set[int] = set()
        self._error: BaseException | None = None
        self._closing = False
        self._kick = False
        self._running = False  # a thread (engine or caller) is running a cycle
        self._arrived = 0.0  # when the first peer message of the next cycle arrived
        self._cycle = 0
        # counts for tests and profiles: cycles run, control messages sent, responses
        # reduced inline (from the cycle messages, no data collective), cycles run on the
        # caller's thread
        self.counts = {"cycles": 0, "control_sent": 0, "inline": 0, "caller": 0, "lane": 0}
        self.cache = ResponseCache(settings.cache_capacity)
        # every rank keeps the coordinator's table (fed the same messages, it decides the
        # same); rank 0 (the lead) also runs the stall inspector
        self.coord = Coordinator(self.size)
        self._lead = self.me == 0
        self.stall = StallInspector(
            self.size,
            settings.stall_check_time,
            settings.stall_shutdown_time,
            not settings.stall_check_disable,
        )
        self._force: dict[str, str] = {}
        self._attendance = Attendance()  # who has submitted what (stall messages)
        self._holders: dict[str, set[int]] = {}
        self.executor = Executor(data, ranks, self.me, settings, timeline)
        peers = [r for r in ranks if r != me_global]
        self.idle_answer_s = settings.timeout / 3
        if not settings.stall_check_disable:
            self.idle_answer_s = min(self.idle_answer_s, settings.stall_check_time / 2)
        self.channel = NegotiationChannel(
            ctl,
            me_global,
            peers,
            self._deliver,
            self._peer_error,
            self._has_work,
            self.idle_answer_s,
        )
        self._thread = threading.Thread(target=self._loop, name="unison-hvd-engine", daemon=True)
        self._last_sent = self._ended = time.monotonic()
        #: steady-state cycles gathered with one collective (:mod:`unison.torch.record`)
        self.lanes = LaneCycles(data, self.size, self.me)
        self._lane_next = False  # every rank's last message said: the next cycle is one
        #: the steady-state blocking all-reduce (:mod:`unison.torch.steady`), where cycles
        #: can be gathered
        self.steady = SteadyPath(self) if self.lanes.ok else None

    def start(self) -> None:
        self.channel.start()
        self._thread.start()

    # --- submission (user threads) --------------------------------------------------------
    def submit(self, entry: Entry) -> None:
        with self._cv:
            self._admit(entry)
            self._new.append(entry)
            self._cv.notify_all()

    def run_blocking(self, entry: Entry) -> None:
        """Submit ``entry`` for a caller that waits on it at once: when the engine is idle
        the caller's thread runs the cycle itself (the engine thread takes over anything
        the cycle leaves pending)."""
        with self._cv:
            self._admit(entry)
            self._new.append(entry)
            if (
                self._running
                or self._pending
                or len(self._new) > 1
                or self._kick
                or self.settings.cycle_time > 0
            ):
                self._cv.notify_all()
                return
            self._running = True
        try:
            self.counts["caller"] += 1
            self._run_cycle()
        except BaseException as exc:
            self._fail_all(exc)
        finally:
            with self._cv:
                self._running = False
                # the engine thread takes over what is left (and its stall checks)
                if self._new or self._pending or self._kick or self._error:
                    self._cv.notify_all()
                elif (self._cycle + 1) in self._inbox:
                    self._cv.notify_all()
                if self._has_work() or (self._lane_next and not self.channel.watching):
                    self.channel.watch()

    def _admit(self, entry: Entry) -> None:
        name = entry.request.name
        if self._error is not None:
            raise HorovodInternalError(
                f"cannot submit {name!r}: the engine failed earlier: {self._error}"
            ) from self._error
        if self._closing:
            raise HorovodInternalError(f"cannot submit {name!r}: Horovod has been shut down")
        if name in self._pending or any(e.request.name == name for e in self._new):
            raise ValueError(
                f"a tensor named {name!r} is already being processed; names of pending "
                "operations must be unique (synchronize the earlier one first)"
            )

    @property
    def cycles(self) -> int:
        """Negotiation cycles completed so far (progress, for waits without a fixed end)."""
        return self._cycle

    def missing_ranks(self, name: str) -> list[int] | None:
        """Global ranks of the set that have not submitted ``name`` (None: this rank does not
        know of it, e.g. it already completed)."""
        with self._cv:
            missing = self._attendance.missing(name, self.cache, self.size)
        return None if missing is None else [self.ranks[r] for r in missing]

    def describe_stall(self, name: str) -> str:
        """Why ``name`` has not completed, naming the ranks that have not submitted it."""
        missing = self.missing_ranks(name)
        if missing is None:
            return "it has not been negotiated yet (the engine may be busy or stalled)"
        if not missing:
            return "every rank has submitted it; it has not finished executing"
        return (
            f"ranks {missing} of the process set have not submitted it "
            f"(submitted by ranks {[x for x in self.ranks if x not in missing]})"
        )

    # --- messages from peers (cycle or watcher thread) ---------------------------------------
    def _deliver(self, peer: int, msg: Any, late: bool = False) -> None:
        """A peer's message; ``late``: the idle watcher found it on one of its looks, up to
        ``idle_answer_s`` after it came, so the answer is due now."""
        r = self.ranks.index(peer)
        with self._cv:
            if msg == "ping":
                return
            if msg == "bye":
                self._gone.add(r)
            elif msg[0] == "C":
                if msg[1] not in self._inbox:
                    self._arrived = time.monotonic() - (self.idle_answer_s if late else 0.0)
                self._inbox.setdefault(msg[1], {})[r] = msg
            # a running cycle waits on the receives itself (NegotiationChannel.pull) and
            # whoever ends it wakes the loop if more is wanted: only an idle loop needs the news
            if not self._running:
                self._cv.notify_all()

    def _peer_error(self, peer: int, exc: BaseException) -> None:
        with self._cv:
            if self._error is None and not self._closing:
                who = f"rank {peer}" if peer >= 0 else "the peers"
                self._error = HorovodInternalError(
                    f"lost contact with {who}: {exc}", ranks=(peer,) if peer >= 0 else ()
                )
            self._cv.notify_all()

    # --- the loop ----------------------------------------------------------------------------
    def _has_work(self) -> bool:
        """Whether a peer's cycle message is wanted at once (read without the lock by
        the watcher: a stale answer costs one look later, never a message)."""
        return bool(self._pending or self._new or self._force or self.coord.busy)

    def _linger(self) -> float:
        """Seconds to wait before answering a peer's cycle (0: now). With nothing of our
        own, the peer cannot use our answer before we submit, and submitting answers."""
        if self._has_work() or self.channel.prompt:
            return 0.0
        return self._arrived + self.idle_answer_s - time.monotonic()

    def _wanted(self) -> bool:
        if self._running:
            return False
        if self._new or self._kick:
            return True
        if self._lane_next:
            # every rank promised to enter the next cycle: a peer's message or goodbye
            # means it has; with nothing of our own we enter within idle_answer_s (the
            # point-to-point path's idle answer), so peers never wait past their deadline
            if (self._cycle + 1) in self._inbox or self._gone:
                return True
            return time.monotonic() - self._ended >= self.idle_answer_s
        return (self._cycle + 1) in self._inbox and self._linger() <= 0

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._wanted():
                        if self._error is not None:
                            raise self._error
                        if self._closing:
                            return
                        # at most idle_answer_s: a caller's cycle may have promised the
                        # next one to the peers without waking this thread
                        t = min(self._idle_timeout(), self.idle_answer_s)
                        if not self._running and (self._cycle + 1) in self._inbox:
                            t = min(t, max(self._linger(), 1e-4))
                        elif not self._running and self._lane_next:
                            due = self._ended + self.idle_answer_s - time.monotonic()
                            t = min(t, max(due, 1e-4))
                        self._cv.wait(t)
                        self._housekeeping()
                    if self._error is not None:
                        raise self._error
                    self._running = True
                if self.settings.cycle_time > 0 and (self._cycle + 1) not in self._inbox:
                    with self._cv:  # Horovod's cycle time: gather more tensors first
                        self._cv.wait(self.settings.cycle_time)
                try:
                    self._run_cycle()
                finally:
                    with self._cv:
                        self._running = False
                        self._cv.notify_all()
                        if self._has_work() or (self._lane_next and not self.channel.watching):
                            self.channel.watch()
        except BaseException as exc:
            self._fail_all(exc)

    def _idle_timeout(self) -> float:
        t = self.settings.timeout / 3
        due = self.stall.next_due(time.monotonic()) if self._lead else None
        return min(t, due) if due is not None else t

    def _housekeeping(self) -> None:
        """Called with the lock held after every idle wake-up: heartbeats and stalls."""
        now = time.monotonic()
        if now - self._last_sent >= self.settings.timeout / 3:
            self._last_sent = now
            threading.Thread(target=self._ping, daemon=True).start()
        if self._lead:
            warn, kill = self.stall.check(self._holders, now)
            if warn:
                text = "; ".join(s.describe() for s in warn)
                warnings.warn(
                    f"unison.torch stall: one or more tensors were submitted by some ranks "
                    f"but not all: {text}",
                    RuntimeWarning,
                    stacklevel=1,
                )
                log.warning("stalled tensors: %s", text)
            for s in kill:
                if s.name not in self._force:
                    self._force[s.name] = (
                        f"stalled for {s.waited:.0f}s (UNISON_STALL_SHUTDOWN_TIME_SECONDS): "
                        f"{s.describe()}"
                    )
                    self._kick = True

    def _ping(self) -> None:
        try:
            self.channel.send_all("ping")
        except Exception:
            pass

    # --- one cycle (unison.torch.cycle) ------------------------------------------------------
    def _run_cycle(self) -> None:
        run_cycle(self)

    def _gather(self, k: int, want: list[int] | None = None) -> dict[int, Any]:
        return gather(self, k, want)

    def _execute(self, responses: list[Response], parts: list[dict[str, bytes]]) -> None:
        execute(self, responses, parts)

    # --- failure and shutdown ---------------------------------------------------------------
    def _fail_all(self, exc: BaseException) -> None:
        if not isinstance(exc, HorovodInternalError):
            err: BaseException = HorovodInternalError(f"the engine failed: {exc!r}")
            err.__cause__ = exc
        else:
            err = exc
        with self._cv:
            if self._error is None:
                self._error = err
            entries = list(self._pending.values()) + self._new
            self._pending.clear()
            self._new = []
        for e in entries:
            e.handle.finish(error=err)

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(self.settings.timeout)
        said_bye = False
        with self._cv:
            enter = self._lane_next and self._error is None and not self._running
            enter = enter and not self._thread.is_alive()
            self._running = self._running or enter
        if enter:  # every peer was promised this rank's next cycle: its goodbye
            said_bye = self._bye_gathered()
        with self._cv:
            entries = list(self._pending.values()) + self._new
            self._pending.clear()
            self._new = []
        for e in entries:
            e.handle.finish(error=HorovodInternalError("Horovod has been shut down"))
        self.channel.close(say_bye=not said_bye)
        self.executor.close()

    def _bye_gathered(self) -> bool:
        """Enter the promised gathered cycle with a goodbye (told point to point first,
        so a listening peer enters at once instead of after ``idle_answer_s``)."""
        k = self._cycle + 1
        try:
            self.channel.send_all("bye")
            self.lanes.mark(k, bye=True)
            self.lanes.exchange(k, self.cache, self.ranks)
            self._cycle = k
        except Exception as exc:  # the peers fail on their own; nothing pending here
            log.debug("goodbye cycle %d failed: %r", k, exc)
        return True
