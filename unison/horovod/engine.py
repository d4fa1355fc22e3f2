"""The engine of one process set: negotiate, then execute in one order.

One thread per process set and rank, woken when work is submitted or a peer
starts a negotiation cycle — never paced by a sleep. A cycle: every rank sends
every peer one small message (the response-cache bits of its pending tensors,
full requests for tensors not in the cache, and from rank 0 the tensors its stall
inspector shuts down) and receives theirs. When only cached tensors are involved
the bitwise AND of the bit vectors decides. Otherwise every rank feeds the same
requests, in rank order, into its own copy of the coordinator's table
(:class:`~unison.horovod.negotiation.Coordinator`), which validates them and yields
the same responses on every rank — no round trip to rank 0. Then every rank executes
the same responses in the same order (:mod:`unison.horovod.execution`; small
all-reduces whose bytes every message carried are reduced from the messages,
:mod:`unison.horovod.carried`).

A cycle starts when there is new local work or a peer's message for it has arrived,
so ranks that submit in different orders meet without polling. A rank with work
pending answers a peer's cycle at once; a rank with nothing of its own answers within
``idle_answer_s`` (its own submission starts the cycle that pairs with the peer's), so
no timing constant is involved. Between cycles the channel's watcher waits on the
peers' messages while this rank has work pending (:mod:`unison.horovod.channel`).

Gathered cycles: when every rank's message of a cycle was pure response-cache
traffic that fits a fixed-size record and the cycle decided all of it, every rank
knows the next cycle is *gathered*: each rank packs its message into a record and one
all_gather on the set's data group hands every rank every message
(:mod:`unison.horovod.record`). A message that does not fit travels point to point
and its record says so. Every rank was promised the gathered cycle, so whoever runs
it enters it: a caller, the engine thread, an idle rank within ``idle_answer_s``, and
:meth:`HorovodEngine.close` with its goodbye.

The caller's thread: a blocking call made while the engine is idle runs the cycle on
the caller's thread (:meth:`HorovodEngine.run_blocking`) and waits on the peers'
receives itself; a named small all-reduce in steady state goes further
(:mod:`unison.horovod.steady`). The cycle is the same on every thread (one runs at a
time: :class:`~unison.horovod.state.EngineState` holds the claim), so peers cannot
tell the difference.

One module: the cycle, its exchange and the engine thread's loop are one state
machine over :class:`~unison.horovod.state.EngineState`.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

from ..comm.api import Group
from .cache import ResponseCache, and_bits, bits_to_ids, ids_to_bits
from .carried import carries, deliver, payload, reduce
from .channel import NegotiationChannel
from .errors import HorovodInternalError
from .execution import ResponseRunner
from .handle import Entry
from .negotiation import Coordinator, Response, TensorRequest, request_of
from .record import GatheredCycles
from .settings import Settings
from .stall import StallInspector
from .state import EngineState
from .steady import SteadyAllreduce
from .timeline import Timeline

__all__ = ["SLICE_S", "HorovodEngine"]

log = logging.getLogger("unison.horovod")

#: a wait for cycle messages looks for a lost peer this often, asleep after its first
#: slice (one wake-up per slice; a lost peer is reported within it)
SLICE_S = 0.05


class HorovodEngine:
    """The engine of one process set on this rank (see the module docstring)."""

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
        # counts for tests and profiles: cycles run, control messages sent, responses
        # reduced from carried bytes, cycles run on the caller's thread, gathered cycles
        self.counts = {"cycles": 0, "control_sent": 0, "carried": 0, "caller": 0, "gathered": 0}
        self.cache = ResponseCache(settings.cache_capacity)
        # every rank keeps the coordinator's table (fed the same messages, it decides the
        # same); rank 0 (the lead) also runs the stall inspector
        self.coord = Coordinator(self.size)
        self.lead = self.me == 0
        self.stall = StallInspector(
            self.size,
            settings.stall_check_time,
            settings.stall_shutdown_time,
            not settings.stall_check_disable,
        )
        self.holders: dict[str, set[int]] = {}
        idle_answer_s = settings.timeout / 3
        if not settings.stall_check_disable:
            idle_answer_s = min(idle_answer_s, settings.stall_check_time / 2)
        self.idle_answer_s = idle_answer_s
        self.state = EngineState(ranks, self.me, self.coord, idle_answer_s)
        self.runner = ResponseRunner(data, ranks, self.me, settings, timeline)
        peers = [r for r in ranks if r != me_global]
        self.channel = NegotiationChannel(
            ctl,
            me_global,
            peers,
            self._deliver,
            self.state.peer_lost,
            self.state.has_work,
            idle_answer_s,
        )
        self._thread = threading.Thread(target=self._loop, name="unison-hvd-engine", daemon=True)
        #: steady-state cycles gathered with one collective (:mod:`unison.horovod.record`)
        self.gathered = GatheredCycles(data, self.size, self.me)
        #: the steady-state blocking all-reduce, where cycles can be gathered
        self.steady = SteadyAllreduce(self) if self.gathered.ok else None

    def start(self) -> None:
        self.channel.start()
        self.state.prompt = self.channel.prompt
        self._thread.start()

    def set_timeline(self, timeline: Timeline | None) -> None:
        self.timeline = self.runner.timeline = timeline

    # --- submission (user threads) --------------------------------------------------------
    def submit(self, entry: Entry) -> None:
        self.state.submit(entry)

    def run_blocking(self, entry: Entry) -> None:
        """Submit ``entry`` for a caller that waits on it at once: when the engine is idle
        the caller's thread runs the cycle itself (the engine thread takes over anything
        the cycle leaves pending)."""
        if not self.state.claim_for_caller(entry, self.settings.cycle_time):
            return
        try:
            self.counts["caller"] += 1
            self.run_cycle()
        except BaseException as exc:
            self.fail(exc)
        finally:
            self.release()

    def release(self) -> None:
        """Give the run claim back (the engine thread takes over what is left)."""
        self.state.release()
        st = self.state
        if st.has_work() or (st.gathered_next and not self.channel.watching):
            self.channel.watch()

    @property
    def cycles(self) -> int:
        """Negotiation cycles completed so far (progress, for waits without a fixed end)."""
        return self.state.cycle

    def missing_ranks(self, name: str) -> list[int] | None:
        """Global ranks of the set that have not submitted ``name`` (None: this rank does not
        know of it, e.g. it already completed)."""
        missing = self.state.missing(name, self.cache)
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

    def _deliver(self, peer: int, msg: Any, late: bool = False) -> None:
        self.state.deliver(self.ranks.index(peer), msg, late)

    # --- one cycle (on the thread holding the run claim) ------------------------------------
    def run_cycle(self) -> None:
        """Run the next cycle on the calling thread: build this rank's message, exchange
        it (point to point or gathered), decide alike on every rank, execute."""
        st = self.state
        k = st.cycle + 1
        entries = st.begin_cycle()
        if self.timeline is not None:
            self.timeline.cycle(time.perf_counter())
        ids: set[int] = set()
        fresh: list[TensorRequest] = []
        for e in entries:
            if e.announced:
                continue
            cid = self.cache.lookup(e.request, self.me)
            if cid is None:
                fresh.append(e.request)
                e.announced = True
            else:
                ids.add(cid)
        # rank 0 alone runs the stall inspector: what it shuts down travels in its message
        force = st.take_forced() if self.lead else {}
        parts = payload(entries) if self.size > 1 else {}  # a set of one reduces nothing
        bits = ids_to_bits(ids)
        # "my next cycle may be gathered in one collective": pure response-cache traffic
        # that fits a record (packed now, used if this cycle is gathered that way too)
        steady = (
            bool(ids)
            and not fresh
            and not force
            and not self.coord.busy
            and self.gathered.steady(("C", k, bits, fresh, force, parts, True), self.cache)
        )
        mine = ("C", k, bits, fresh, force, parts, steady)
        self.counts["cycles"] += 1
        if st.gathered_next:
            msgs = self._gathered_exchange(mine, k, steady)
        else:
            self.channel.send_all(mine)
            self.counts["control_sent"] += self.size - 1
            st.last_sent = time.monotonic()
            msgs = self.gather(k)
        msgs[self.me] = mine
        self.decide(k, msgs)

    def decide(self, k: int, msgs: dict[int, Any]) -> None:
        """Cycle ``k`` given every rank's message: decide alike on every rank, execute."""
        st = self.state
        st.record(msgs)
        # every rank holds every rank's message and the same coordinator table, so every
        # rank decides alike: no round trip to a coordinator, even for new requests
        coordinated = any(m[3] for m in msgs.values()) or bool(msgs[0][4]) or self.coord.busy
        # the next cycle is gathered when every message was steady and this one decides
        # everything every rank announced (the same bits everywhere): then no rank has
        # anything pending but what it submits next, which makes it enter at once
        gathered_next = (
            self.size > 1
            and not coordinated
            and all(msgs[r][6] and msgs[r][2] == msgs[0][2] for r in range(self.size))
        )
        st.advance(k, gathered_next)
        self.channel.listen = gathered_next
        if not coordinated:
            ready = bits_to_ids(and_bits([msgs[r][2] for r in range(self.size)]))
            responses = [self.cache.get(i) for i in ready]
            if self.lead:
                self._observe(msgs)
        else:
            for r in range(self.size):
                m = msgs[r]
                self.coord.add(r, m[3])
                self.coord.add(r, [request_of(self.cache.get(i), r) for i in bits_to_ids(m[2])])
            if self.lead:
                self._observe(msgs)
            responses = self.coord.ready(msgs[0][4])
        if responses:
            self._execute(responses, [msgs[r][5] for r in range(self.size)])
        st.ended = time.monotonic()

    def _observe(self, msgs: dict[int, Any]) -> None:
        """Coordinator: who holds which pending tensor (for the stall inspector)."""
        holders: dict[str, set[int]] = {}
        for r in range(self.size):
            for i in bits_to_ids(msgs[r][2]):
                holders.setdefault(self.cache.get(i).name, set()).add(r)
        for name, reqs in self.coord.table.items():
            holders.setdefault(name, set()).update(reqs)
        for r in self.coord.joined:
            for s in holders.values():
                s.add(r)
        self.observe_holders(holders)

    def observe_holders(self, holders: dict[str, set[int]]) -> None:
        """The lead's stall inspector learns who holds which pending tensor now."""
        if holders is not self.holders:
            self.holders = holders
            self.stall.observe(holders, time.monotonic())

    def _gathered_exchange(self, mine: tuple[Any, ...], k: int, packed: bool) -> dict[int, Any]:
        """Cycle ``k``'s messages through one collective (every rank enters it); a
        message that did not fit comes point to point."""
        self.counts["gathered"] += 1
        if not packed and not self.gathered.pack(mine, self.cache):
            self.channel.send_all(mine)
            self.counts["control_sent"] += self.size - 1
            self.gathered.mark(k, p2p=True)
        self.state.last_sent = time.monotonic()
        return self.after_gathered(k, *self.gathered.exchange(k, self.cache, self.ranks))

    def after_gathered(
        self, k: int, msgs: dict[int, Any], p2p: list[int], bye: list[int]
    ) -> dict[int, Any]:
        """The peers' messages of gathered cycle ``k``: goodbyes noted, point-to-point ones
        (records that said so) waited for."""
        if bye:
            self.state.say_gone(bye)
            self.channel.forget([self.ranks[r] for r in bye])
        if p2p:
            msgs.update(self.gather(k, p2p))
        return msgs

    def gather(self, k: int, want: list[int] | None = None) -> dict[int, Any]:
        """Cycle ``k``'s messages from the peers (``want``: only these set ranks), waited
        for on the calling thread."""
        deadline = time.monotonic() + self.settings.timeout
        need = [r for r in range(self.size) if r != self.me] if want is None else want
        quiet = False
        while True:
            got, before, work = self.state.collect(k, need, self.channel.posted)
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                heard = self.state.heard_from(k)
                missing = [self.ranks[r] for r in need if r not in heard]
                raise HorovodInternalError(
                    f"negotiation timed out after {self.settings.timeout:g}s; "
                    f"not heard from ranks {missing}",
                    ranks=missing,
                )
            if quiet:  # a slice without a message: is a peer lost? (outside the state's
                self.channel.check_peers()  # lock: it may take messages that arrived)
            # the first slice drives the transport (a prompt peer answers in microseconds);
            # after a quiet one the peer is slow: sleep, checking for a lost peer each slice
            self.channel.pull(work, min(left, SLICE_S), asleep=quiet)
            quiet = len(self.state.heard_from(k)) == before

    def _execute(self, responses: list[Response], parts: list[dict[str, bytes]]) -> None:
        local = self.state.decided(responses, time.perf_counter())
        rest: list[Response] = []
        rest_local: list[Entry | None] = []
        for resp, e in zip(responses, local, strict=True):
            if self.size > 1 and carries(resp, parts):
                self.counts["carried"] += 1
                start = time.perf_counter()
                self.runner.queue_spans([resp], [e], start)
                flat = reduce(resp, parts, self.size)
                self.runner.span(resp.name, "ALLREDUCE", start, time.perf_counter(), inline=1)
                if e is not None:
                    e.handle.finish(e.finish(e, deliver(e, flat)))
            else:
                rest.append(resp)
                rest_local.append(e)
        if rest:
            self.runner.run(rest, rest_local)
        for resp in responses:
            self.cache.put(resp)

    # --- the engine thread --------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self.state.await_work(
                self._idle_timeout, self._housekeeping, self.settings.cycle_time
            ):
                try:
                    self.run_cycle()
                finally:
                    self.release()
        except BaseException as exc:
            self.fail(exc)

    def _idle_timeout(self) -> float:
        t = self.settings.timeout / 3
        due = self.stall.next_due(time.monotonic()) if self.lead else None
        return min(t, due) if due is not None else t

    def _housekeeping(self, now: float) -> dict[str, str]:
        """After every idle wake-up (under the state's lock): heartbeats and stalls;
        returns the tensors the stall inspector shuts down."""
        st = self.state
        if now - st.last_sent >= self.settings.timeout / 3:
            st.last_sent = now
            threading.Thread(target=self._ping, daemon=True).start()
        if not self.lead:
            return {}
        warn, kill = self.stall.check(self.holders, now)
        if warn:
            text = "; ".join(s.describe() for s in warn)
            warnings.warn(
                f"unison Horovod stall: one or more tensors were submitted by some ranks "
                f"but not all: {text}",
                RuntimeWarning,
                stacklevel=1,
            )
            log.warning("stalled tensors: %s", text)
        return {
            s.name: (
                f"stalled for {s.waited:.0f}s (UNISON_STALL_SHUTDOWN_TIME_SECONDS): {s.describe()}"
            )
            for s in kill
        }

    def _ping(self) -> None:
        try:
            self.channel.send_all("ping")
        except Exception:
            pass

    # --- failure and shutdown ---------------------------------------------------------------
    def fail(self, exc: BaseException) -> BaseException:
        """Fail every pending operation with ``exc`` (the engine is broken); returns the
        error the engine keeps (the first)."""
        return self.state.fail(exc)

    def close(self) -> None:
        self.state.close()
        self._thread.join(self.settings.timeout)
        said_bye = False
        if not self._thread.is_alive() and self.state.claim_goodbye():
            # every peer was promised this rank's next cycle: its goodbye
            said_bye = self._bye_gathered()
        for e in self.state.drain():
            e.handle.finish(error=HorovodInternalError("Horovod has been shut down"))
        self.channel.close(say_bye=not said_bye)
        self.runner.close()

    def _bye_gathered(self) -> bool:
        """Enter the promised gathered cycle with a goodbye (told point to point first,
        so a listening peer enters at once instead of after ``idle_answer_s``)."""
        k = self.state.cycle + 1
        try:
            self.channel.send_all("bye")
            self.gathered.mark(k, bye=True)
            self.gathered.exchange(k, self.cache, self.ranks)
            self.state.advance(k, False)
        except Exception as exc:  # the peers fail on their own; nothing pending here
            log.debug("goodbye cycle %d failed: %r", k, exc)
        return True
