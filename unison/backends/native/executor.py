"""The native engine's side of one group: the one owner of the group's run state.

:class:`Executor` runs the operations the native backend submits for a
:class:`~unison.comm.group.Group`: it numbers each call in issue order, builds its
:class:`OpContext` and runs them one at a time in that order; when one fails on any
rank it makes the failure reach every member promptly (an ABORT control frame),
after which the group is broken and refuses further collectives instead of hanging
or returning garbage. Transport events for the group (frames of another operation,
lost peers, other ranks' aborts and timeout notices) arrive here from the runtime.

It owns everything "one operation at a time per group" needs, under one lock: the
sequence numbers, the last finished one, the busy flag, the queue of operations
waiting their turn (and the worker thread that runs them), and the aborts that came
before their operation. Two ways in take a turn:

- :meth:`submit` numbers an operation and returns its Work; a blocking call on an
  idle group then runs it in the caller's thread, anything else queues it for the
  worker (started on first use, woken by a condition variable, never paced by sleep);
- :meth:`run` (the :class:`~unison.comm.backend.CallerThreadCollectives` entry of a
  group with slots) runs a prepared small call straight on the slots in the caller's
  thread, or declines when anything else is in flight
  (:mod:`.slot_collectives`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import OpCode, OpSig, ReduceOp
from ...algorithms import OpContext, Topology, describe
from ...buffers import DType
from ...comm.group import Group
from ...comm.work import Work
from ...errors import AbortedError, CommunicationError, MismatchError
from ...log import get_logger
from ...transport.framing import Control
from .desync import (
    CONFIRM_EARLY_BY_MESSAGE,
    CONFIRM_FIRST,
    ROOTED,
    Confirmation,
    check_sig,
    foreign_frame_error,
)
from .message_calls import MessageCall, prepare_message_call
from .receipts import RECEIPT_STEP, Batch
from .slot_collectives import ContextWatch, SlotCall, prepare_call

if TYPE_CHECKING:
    from ...transport.seqslot import SeqSlots
    from .runtime import Runtime

__all__ = ["Executor"]

log = get_logger("executor")


class Executor:
    """Runs one group's operations on the native engine (members and non-members)."""

    def __init__(self, rt: Runtime, group: Group, topo: Topology) -> None:
        self.rt = rt
        self.group = group
        self.id = group.id
        self.ranks = group.ranks
        self.size = group.size
        #: the group's link, shared slots and host layout (what algorithms may use)
        self.topo = topo
        #: what the worker thread is called (and what a shut-down group says it is)
        self.name = f"group-{group.id}"
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # the worker waits here for its turn
        self._seq = 0  # the last sequence number given out
        self._done = 0  # the last one finished
        self._busy = False  # an operation runs now (in a caller's thread or on the worker)
        self._closed = False
        self._queue: deque[Callable[[], Callable[[], None]]] = deque()
        self._thread: threading.Thread | None = None
        self._inflight: dict[int, OpContext] = {}
        self._early_aborts: dict[int, BaseException] = {}
        self._notices: dict[int, dict[int, list[int]]] = {}  # seq -> {rank: waiting for}
        self._notice_cv = threading.Condition(self._lock)
        #: the group's small-message slots (members of a one-host job), else None
        self.slots: SeqSlots | None = None
        #: what the group's operations synchronise the rounds of a direct shared-memory
        #: algorithm with (:attr:`OpContext.round_barrier`; set with the group's arena)
        self.round_barrier: Callable[[OpContext, int], None] | None = None
        self.timeout = group.config.timeout
        self._others = [r for r in self.ranks if r != rt.rank]
        # the caller-thread call running now: its number (0: none), its prepared call,
        # and frames of its operation that peers on the general path sent meanwhile
        self._running = 0
        self._call: SlotCall | None = None
        self._foreign: list[tuple[int, OpSig]] = []
        self._scanned = False
        self._watch = ContextWatch(rt, self._caller_context, self._check_caller_call)
        #: a two-rank group's broadcasts by message (no shared memory) are confirmed in
        #: batches (receipts); None elsewhere, so the slot path's check costs nothing
        self._batch: Batch | None = Batch() if group.size == 2 and not topo.shared else None
        #: the largest all-reduce a group without slots runs in the caller's thread
        #: (:mod:`.message_calls`): what the TCP transport sends from the caller's thread
        self.message_call_bytes = group.config.inline_send_bytes

    def sig(
        self, op: OpCode, dtype: int = 0, count: int = 0, redop: int = 0, root: int = -1
    ) -> OpSig:
        """The signature every frame of the operation carries (op only when unchecked)."""
        if not self.group.config.check_mismatch:
            return OpSig(op=int(op))
        return OpSig(int(op), int(dtype), int(redop), int(root), int(count))

    # --- running collectives -------------------------------------------------------------
    def submit(
        self, op: OpCode, sig: OpSig, body: Callable[[OpContext], Any], on_slots: bool = False
    ) -> Work:
        """Number the operation now (issue order) and return its Work; it runs when the
        shared layer starts the Work (in the caller's thread if blocking and idle).
        ``on_slots``: ``body`` runs the operation on the group's small-message slots."""
        me = self.group.rank
        assert me is not None  # members only: the shared layer checked
        hook = self.rt.op_hook
        if hook is not None:  # fault injection in tests: runs in the caller's thread
            hook(self.group, self._seq + 1, op)
        with self._lock:
            self._seq += 1
            seq = self._seq
        # decided now, with the topology the body's algorithm was chosen with: every
        # member submits in the same order, so every member decides alike (when it
        # runs, a group's arena may have been settled on one member and not yet on
        # another, and a confirmation started on one side only would wait forever). A
        # call on the slots never starts one: its slots compare every rank's signature,
        # and a peer may run the same call in its own thread (run()), which confirms
        # nothing by message
        confirm_first = op in CONFIRM_FIRST or (
            op in CONFIRM_EARLY_BY_MESSAGE and not on_slots and not self.topo.shared
        )

        def launch(caller_waits: bool) -> None:
            self._run_ordered(task, caller_waits)

        work = Work(f"{op.label} #{seq} (group {self.id})", launch)

        def task() -> Callable[[], None]:
            return self._execute(seq, me, op, sig, body, work, confirm_first)

        return work

    def _execute(
        self,
        seq: int,
        me: int,
        op: OpCode,
        sig: OpSig,
        body: Callable[[OpContext], Any],
        work: Work,
        confirm_first: bool,
    ) -> Callable[[], None]:
        """Run operation ``seq``; returns what completes its ``work``, for the caller of
        the turn to run once the turn is released (so that whoever ``wait()`` wakes finds
        the group idle, and its next blocking call may run in its own thread).
        ``confirm_first``: a rooted collective's signature confirmation starts before
        the data moves."""
        cfg = self.group.config
        checked = op in ROOTED and cfg.check_mismatch and self.size > 1
        batch = self._batch
        # a two-rank broadcast by message that carries data is confirmed in a batch
        batched = (
            batch is not None
            and checked
            and confirm_first
            and op in CONFIRM_EARLY_BY_MESSAGE
            and sig.count > 0
        )
        if batch and (not batched or not batch.continued_by(sig)):
            failed = self._close_batch()
            if failed is not None:  # the batch's calls failed: this call does not start
                with self._lock:
                    self._done = max(self._done, seq)
                return partial(work.finish, error=failed)
        ctx = self.context(seq, me, op, sig, time.monotonic() + cfg.timeout)
        with self._lock:
            broken = self._broken_error(ctx)
            told = None if broken is not None else self._early_aborts.pop(seq, None)
            early = broken or told
            if early is None:
                self._inflight[seq] = ctx
            else:
                self._done = max(self._done, seq)
        if told is not None:
            # another rank failed this call before it started here: pass the news on, as
            # for a failure met during the call, before this rank can leave (a peer may
            # otherwise hear this rank's goodbye before the news from its origin)
            early = told = ctx.named(told) if isinstance(told, CommunicationError) else told
            self.fail(ctx, told)
        if early is not None:
            return partial(work.finish, error=early)
        kept = False  # a batched call the root keeps in flight until its receipt
        try:
            self._scan_buffered(ctx)
            confirm = None
            if checked and confirm_first and not batched:
                confirm = Confirmation(ctx, self._check_context(ctx))
                confirm.start()  # before the data moves (see desync)
            # the signature names the global root
            kept = batched and sig.root == self.rt.rank
            if batched and not kept:
                # the receiver's receipt says which calls it made: it goes out as the
                # call that fills the batch starts, so the root's next call need not
                # wait for this one's data to arrive (a frame of it that disagrees
                # still fails both ranks: this rank aborts the call)
                assert batch is not None
                batch.add(ctx)
                if batch.full:
                    failed = self._close_batch()
                    if failed is not None:
                        return partial(work.finish, error=failed)
            result = body(ctx)
            if kept:
                assert batch is not None
                batch.add(ctx)
            elif checked and not batched and not ctx.all_pairs_checked:
                # made only when needed: the shared-memory rounds of a broadcast
                # compare every pair's signature already (most large broadcasts)
                if confirm is None:
                    confirm = Confirmation(ctx, self._check_context(ctx))
                confirm.finish()
            elif confirm is not None and confirm.started:
                confirm.drain()
        except CommunicationError as exc:
            err = ctx.named(exc)
            self.fail(ctx, err)
            return partial(work.finish, error=err)
        except BaseException as exc:
            self.fail(ctx, ctx.local_failure(exc))
            return partial(work.finish, error=exc)
        else:
            return partial(work.finish, result)
        finally:
            with self._lock:
                if not kept:  # a kept call still hears aborts and frames for it
                    self._inflight.pop(seq, None)
                    self._notices.pop(seq, None)
                self._done = max(self._done, seq)

    def _close_batch(self) -> BaseException | None:
        """End the group's open batch of broadcasts (:mod:`.receipts`), in the group's
        turn: the receiver sends its receipt; the root receives it, within a deadline of
        its own, and compares it with its own (neither, in a group already broken: the
        next call says so). Returns the failure, with the group failed as the batch's
        calls would have failed it, or None."""
        batch = self._batch
        assert batch is not None and batch
        root, mine, which = batch.root, batch.receipt(), batch.describe()
        calls = batch.close()
        last = calls[-1]
        peer = 1 - last.rank
        if self.group.broken is not None:  # failed already: nobody sends or waits
            for ctx in calls:
                self._forget_context(ctx)
            return None
        if root != self.rt.rank:  # the receiver: its calls are not kept in flight
            try:
                self._receipt_context([last]).send(peer, RECEIPT_STEP, mine)
            except CommunicationError as exc:
                err = last.named(exc)
                self.fail(last, err)
                return err
            return None
        check = self._receipt_context(calls)
        try:
            theirs = np.zeros(3, np.int64)
            check.recv(peer, RECEIPT_STEP, theirs)
            if not np.array_equal(theirs, mine):
                raise MismatchError(
                    f"mismatched collective at broadcast {which} (group {self.id}): rank "
                    f"{self.ranks[peer]} made other calls than rank {self.rt.rank}",
                    op=last.label,
                    seq=last.seq,
                    group=self.id,
                    ranks=(self.ranks[peer], self.rt.rank),
                )
        except CommunicationError as exc:
            err = last.named(exc)
            self.fail(last, err)
            return err
        except BaseException as exc:
            self.fail(last, last.local_failure(exc))
            return exc
        finally:
            for ctx in calls:
                self._forget_context(ctx)
        return None

    def _receipt_context(self, calls: list[OpContext]) -> OpContext:
        """The context a batch's receipt travels on: the last call's confirmation context,
        with a deadline of its own, aborted whenever any of ``calls`` is (the root's,
        kept in flight until the receipt)."""
        check = self._check_context(calls[-1])
        check.deadline = time.monotonic() + check.timeout  # the calls' deadlines have run
        with self._lock:
            for ctx in calls:
                ctx.companion = check
            late = next((c.aborted for c in calls if c.aborted is not None), None)
        if late is not None:
            check.abort(late)
        return check

    def _forget_context(self, ctx: OpContext) -> None:
        with self._lock:
            self._inflight.pop(ctx.seq, None)
            self._notices.pop(ctx.seq, None)

    def context(self, seq: int, me: int, op: OpCode, sig: OpSig, deadline: float) -> OpContext:
        """Operation ``seq``'s context (a caller-thread call builds one only for an error)."""
        cfg = self.group.config
        ctx = OpContext(
            self.rt.router,
            op=op,
            group_id=self.id,
            seq=seq,
            ranks=self.ranks,
            rank=me,
            sig=sig,
            deadline=deadline,
            timeout=cfg.timeout,
            segment_bytes=cfg.segment_bytes,
            topo=self.topo,
        )
        ctx.diagnose = self._diagnose_timeout
        ctx.round_barrier = self.round_barrier
        return ctx

    # --- turns: one operation at a time, in issue order ------------------------------------
    def _run_ordered(self, task: Callable[[], Callable[[], None]], caller_waits: bool) -> None:
        """Run ``task`` in its turn: now in this thread if ``caller_waits`` and the group is
        idle, else on the worker thread after everything queued before it. The turn ends
        before the completion ``task`` returns runs."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is shut down")
            if caller_waits and not self._busy and not self._queue:
                self._busy = True
            else:
                self._queue.append(task)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name=f"unison-{self.name}", daemon=True
                    )
                    self._thread.start()
                self._cv.notify_all()
                return
        try:
            complete = task()
        finally:
            with self._lock:
                self._busy = False
                if self._queue:  # only the worker waits, and only for queued work
                    self._cv.notify_all()
        complete()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._busy or not self._queue:
                    if self._closed and not self._queue:
                        return
                    self._cv.wait(1.0)
                task = self._queue.popleft()
                self._busy = True
            try:
                complete = task()
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
            complete()

    # --- the caller-thread path (CallerThreadCollectives) ------------------------------------
    def prepare(
        self,
        op: OpCode,
        arr: np.ndarray,
        nbytes: int,
        dtype: DType,
        redop: ReduceOp | None = None,
        root: int = -1,
        gather_list: bool = False,
    ) -> SlotCall | MessageCall | None:
        """A validated signature's call on the slots, or by message for a group without
        them (None: neither takes it)."""
        if self.slots is None:
            return prepare_message_call(self, op, arr.size, nbytes, dtype, redop)
        return prepare_call(self, self.slots, op, arr, nbytes, dtype, redop, root, gather_list)

    def run(self, call: Any, inp: Any, out: Any) -> bool:
        """Run the prepared ``call`` on the slots now, in the caller's thread, if nothing
        else of the group is in flight here (False, having done nothing, otherwise):
        take the group's next sequence number, publish, wait, finish, and fail the group
        as :meth:`_execute` would if it fails. Written out in one method but for taking
        the turn (:meth:`_claim_turn`): each call here is a Python call fewer on the
        small blocking path. A call by message goes to :meth:`_run_message`."""
        if type(call) is MessageCall:
            return self._run_message(call, inp)
        seq = self._claim_turn()
        if not seq:
            return False
        self._running = seq
        self._call = call
        slots = self.slots
        assert slots is not None
        slots.watch = self._watch
        try:
            slots.run(call.plan, inp, out, self.timeout, call.word)
        except BaseException as exc:
            raise self._caller_failed(exc) from None
        finally:
            slots.watch = None
            self._done = seq
            self._running = 0
            self._busy = False
            if self._queue:  # another thread queued work meanwhile: the worker waits for us
                with self._cv:
                    self._cv.notify_all()
            if self._foreign or self._scanned:
                self._foreign = []
                self._scanned = False
        return True

    def _claim_turn(self) -> int:
        """The group's next sequence number, taken for a call in the caller's thread if
        nothing else of the group is in flight here; 0 (nothing taken) otherwise."""
        with self._lock:
            if (
                self._seq != self._done
                or self._busy
                or self._queue
                or self._closed
                or self._batch
                or self.group.broken is not None
                or self._early_aborts  # a peer already failed a call: _execute says so
                or self.rt.op_hook is not None
            ):
                return 0
            self._seq = seq = self._seq + 1
            self._busy = True
        return seq

    def _run_message(self, call: MessageCall, arr: np.ndarray) -> bool:
        """Run the prepared all-reduce ``call`` on ``arr`` by message now, in the caller's
        thread, if nothing else of the group is in flight here (False otherwise): as
        :meth:`_execute` runs the general path's body, without its Work and turn."""
        # chosen before the call is numbered, as the general path chooses before submit
        # (a group's first choice may settle its arena with its members)
        algo = self.rt.choose("all_reduce", self.size, call.nbytes, self.group).module
        seq = self._claim_turn()
        if not seq:
            return False
        try:
            me = self.group.rank
            assert me is not None
            ctx = self.context(seq, me, call.op, call.sig, time.monotonic() + self.timeout)
            with self._lock:
                broken = self._broken_error(ctx)
                told = None if broken is not None else self._early_aborts.pop(seq, None)
                if broken is None and told is None:
                    self._inflight[seq] = ctx
            if broken is not None:
                raise broken
            if told is not None:  # pass the news on before leaving, as _execute does
                told = ctx.named(told) if isinstance(told, CommunicationError) else told
                self.fail(ctx, told)
                raise told
            try:
                self._scan_buffered(ctx)
                flat = arr.reshape(-1)
                algo.run(ctx, flat, call.kern, call.rop, call.dtype, ctx.seg_count(call.dtype))
            except CommunicationError as exc:
                err = ctx.named(exc)
                self.fail(ctx, err)
                raise err from None
            except BaseException as exc:
                self.fail(ctx, ctx.local_failure(exc))
                raise
        finally:
            with self._lock:
                self._inflight.pop(seq, None)
                self._notices.pop(seq, None)
                self._done = max(self._done, seq)
                self._busy = False
                if self._queue:  # another thread queued work meanwhile
                    self._cv.notify_all()
        return True

    def _caller_context(self) -> OpContext:
        """The running caller-thread call's context, built for its errors only."""
        call = self._call
        me = self.group.rank
        assert call is not None and me is not None
        return self.context(self._running, me, call.op, call.sig, 0.0)

    def _check_caller_call(self) -> None:
        """Raise what failed elsewhere during the caller-thread call: another rank's
        abort, a broken group, a lost peer, a frame of another operation."""
        if self._early_aborts:
            with self._lock:
                exc = self._early_aborts.pop(self._running, None)
            if exc is not None:
                raise exc
        broken = self.group.broken
        if broken is not None:
            raise broken
        lost = self.rt.fabric.gone(self._others)
        if lost is not None:
            raise lost
        if self.group.config.check_mismatch:
            found = self._foreign
            if not self._scanned:  # frames that arrived before this call began
                self._scanned = True
                for t in self.rt.fabric.transports:
                    found.extend(t.unexpected_sigs(self.id, self._running))
            if found:
                ctx = self._caller_context()
                for peer, sig in found:
                    err = foreign_frame_error(ctx, peer, sig)
                    if err is not None:
                        raise err

    def _caller_failed(self, exc: BaseException) -> BaseException:
        """Fail the running caller-thread call as :meth:`_execute` fails an operation:
        break the group, tell every peer (ABORT); returns the error to raise."""
        ctx = self._caller_context()
        if isinstance(exc, CommunicationError):
            err = ctx.named(exc)  # as the general path names it
            self.fail(ctx, err)
            return err
        self.fail(ctx, ctx.local_failure(exc))
        return exc

    def _check_context(self, ctx: OpContext) -> OpContext:
        """A context for the signature confirmation, aborted whenever ``ctx`` is."""
        check = OpContext(
            self.rt.router,
            op=OpCode.CHECK,
            group_id=self.id,
            seq=ctx.seq,
            ranks=self.ranks,
            rank=ctx.rank,
            sig=check_sig(ctx.sig),
            deadline=ctx.deadline,
            timeout=ctx.timeout,
            segment_bytes=1 << 16,
            tag_base=1 << 31,
        )
        check.data_sig = ctx.sig
        check.diagnose = self._diagnose_timeout
        with self._lock:
            ctx.companion = check
            late = ctx.aborted
        if late is not None:
            check.abort(late)
        return check

    def _broken_error(self, ctx: OpContext) -> BaseException | None:
        broken = self.group.broken
        if broken is None:
            return None
        return AbortedError(
            f"{ctx.name} refused: group {self.id} is unusable since an earlier failure: {broken}",
            op=ctx.op.label,
            seq=ctx.seq,
            group=self.id,
            ranks=getattr(broken, "ranks", ()),
        )

    def fail(self, ctx: OpContext, exc: BaseException) -> None:
        self.group.mark_broken(exc)
        ctx.finish()
        self.rt.forget(self.id, ctx.seq)
        relayed = exc.abort_payload if isinstance(exc, CommunicationError) else None
        if relayed is not None:
            # Learnt from another rank: pass the same news on before this rank can exit,
            # so every peer hears it ahead of our goodbye (streams are ordered per peer).
            payload = relayed
        else:
            kind = "mismatch" if isinstance(exc, MismatchError) else type(exc).__name__
            payload = json.dumps(
                {
                    "group": self.id,
                    "seq": ctx.seq,
                    "kind": kind,
                    "op": ctx.op.label,
                    "message": str(exc),
                    "origin": self.rt.rank,
                }
            ).encode()
        self._tell_members(payload)

    # --- failures reported by other ranks or the transport -----------------------------------
    def remote_abort(self, seq: int, exc: BaseException) -> None:
        with self._lock:
            ctx = self._inflight.get(seq)
            if ctx is None:
                if seq > self._done:
                    self._early_aborts[seq] = exc
                else:
                    self.group.mark_broken(exc)
                return
        ctx.abort(exc)

    def _diagnose_timeout(self, ctx: OpContext, waiting: list[int]) -> tuple[list[int], list[str]]:
        """Tell the group this rank timed out, hear who else did; the rest are silent."""
        me = self.rt.rank
        payload = json.dumps(
            {
                "group": self.id,
                "seq": ctx.seq,
                "kind": "timeout-notice",
                "origin": me,
                "waiting": waiting,
                "doing": f"{ctx.name} {describe(ctx.data_sig)}",
            }
        ).encode()
        self._tell_members(payload)
        grace = time.monotonic() + min(1.0, 0.25 * ctx.timeout)
        others = [r for r in self.ranks if r != me]
        with self._notice_cv:
            while len(self._notices.get(ctx.seq, {})) < len(others):
                left = grace - time.monotonic()
                if left <= 0:
                    break
                self._notice_cv.wait(left)
            reported = set(self._notices.get(ctx.seq, {}))
        silent = [r for r in others if r not in reported] or waiting
        notes = []
        for r in silent:
            elsewhere = self.rt.stuck.get(r)
            if elsewhere is not None and (elsewhere[0], elsewhere[1]) != (self.id, ctx.seq):
                notes.append(
                    f"rank {r} is itself blocked in {elsewhere[2]}: the ranks are in different "
                    "collectives (or groups)"
                )
        return silent, notes

    def timeout_notice(self, seq: int, origin: int, waiting: list[int]) -> None:
        with self._notice_cv:
            if seq > self._done or seq in self._inflight:
                self._notices.setdefault(seq, {})[origin] = waiting
                self._notice_cv.notify_all()

    def foreign_frame(self, seq: int, peer: int, sig: OpSig) -> None:
        """A frame for operation ``seq`` arrived unasked; if it is another op, fail now."""
        with self._lock:
            ctx = self._inflight.get(seq)
        if not self.group.config.check_mismatch:
            return
        if ctx is None:
            if self._running == seq:  # a caller-thread call has no context
                self._foreign.append((peer, sig))
            return
        err = foreign_frame_error(ctx, peer, sig)
        if err is not None:
            ctx.abort(err)

    def _scan_buffered(self, ctx: OpContext) -> None:
        """Frames of this operation that arrived before it started may already disagree."""
        if not self.group.config.check_mismatch:
            return
        for t in self.rt.fabric.transports:
            for peer, sig in t.unexpected_sigs(self.id, ctx.seq):
                err = foreign_frame_error(ctx, peer, sig)
                if err is not None:
                    ctx.abort(err)
                    return

    def peer_lost(self, exc: CommunicationError) -> None:
        """A member's connection closed. The calls in flight here fail, and each passes
        the news on as it fails (:meth:`fail`). With none in flight, the group's next
        call is refused before it reaches this executor, so this rank passes the news on
        now, as an abort of the next call: a member already waiting in it then hears
        which rank was lost before it can hear this rank's goodbye, and names the lost
        rank rather than this one."""
        first = self.group.mark_broken(exc)
        with self._lock:
            running = list(self._inflight.values())
            # a caller-thread call in progress fails, and tells, as it notices; the news
            # here is then for the call after it
            following = max(self._done, self._running) + 1
        for ctx in running:
            ctx.abort(exc)
        if not first or running:
            return
        payload = json.dumps(
            {
                "group": self.id,
                "seq": following,
                "kind": "peer-lost",
                "lost": list(exc.ranks),
                "message": str(exc),
                "origin": self.rt.rank,
            }
        ).encode()
        self._tell_members(payload, skip=exc.ranks)

    def _tell_members(self, payload: bytes, skip: Sequence[int] = ()) -> None:
        """Send ``payload`` (an ABORT control message) to every other member but ``skip``."""
        for peer in self.ranks:
            if peer != self.rt.rank and peer not in skip:
                self.rt.send_control(peer, Control.ABORT, payload)

    def retire(self, why: str) -> None:
        """The group's world was shut down: name the reason in later refusals."""
        self.name = f"group {self.id} ({why})"

    def close(self, timeout: float = 5.0) -> None:
        """Refuse further operations, let the worker finish what is queued, and end an
        open batch of broadcasts (the receiver sends its receipt, the root waits for it,
        as the batch's calls would have; a failure is logged: no call is left to raise
        it in)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            idle = not self._busy and not self._queue
            if idle:
                self._busy = True
        if not idle:
            return
        try:
            err = self._close_batch() if self._batch else None
        finally:
            with self._lock:
                self._busy = False
        if err is not None:
            log.error("at shutdown: %s", err)
