"""The native engine's side of one group: numbering, ordered execution, failure routing.

:class:`Executor` runs the operations the native backend submits for a
:class:`~unison.comm.group.Group`: it numbers each call in issue order, builds its
:class:`OpContext` and runs it on the group's ordered queue; when one fails on any
rank it makes the failure reach every member promptly (an ABORT control frame),
after which the group is broken and refuses further collectives instead of hanging
or returning garbage. Transport events for the group (frames of another operation,
lost peers, other ranks' aborts and timeout notices) arrive here from the runtime.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...algorithms import OpCode, OpContext, Topology, describe
from ...comm.group import Group
from ...comm.work import Work
from ...errors import AbortedError, CommunicationError, MismatchError
from ...transport.framing import Control, OpSig
from .desync import ROOTED, Confirmation, foreign_frame_error
from .ordered import OrderedQueue

if TYPE_CHECKING:
    from ...transport.seqslot import SeqSlots
    from .lane import Lane
    from .runtime import Runtime

__all__ = ["Executor"]


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
        self.queue = OrderedQueue(f"group-{group.id}")
        self._lock = threading.Lock()
        self._seq = 0
        self._done = 0
        self._inflight: dict[int, OpContext] = {}
        self._early_aborts: dict[int, BaseException] = {}
        self._notices: dict[int, dict[int, list[int]]] = {}  # seq -> {rank: waiting for}
        self._notice_cv = threading.Condition(self._lock)
        #: the group's small-message slots (members of a one-host job), else None
        self.slots: SeqSlots | None = None
        #: the blocking small-collective fast path over ``slots`` (see :mod:`.lane`)
        self.lane: Lane | None = None

    def sig(
        self, op: OpCode, dtype: int = 0, count: int = 0, redop: int = 0, root: int = -1
    ) -> OpSig:
        """The signature every frame of the operation carries (op only when unchecked)."""
        if not self.group.config.check_mismatch:
            return OpSig(op=int(op))
        return OpSig(int(op), int(dtype), int(redop), int(root), int(count))

    # --- running collectives -------------------------------------------------------------
    def submit(self, op: OpCode, sig: OpSig, body: Callable[[OpContext], Any]) -> Work:
        """Number the operation now (issue order) and return its Work; it runs when the
        shared layer starts the Work (inline in the caller's thread if blocking and idle)."""
        me = self.group.rank
        assert me is not None  # members only: the shared layer checked
        hook = self.rt.op_hook
        if hook is not None:  # fault injection in tests: runs in the caller's thread
            hook(self.group, self._seq + 1, op)
        with self._lock:
            self._seq += 1
            seq = self._seq

        def launch(inline: bool) -> None:
            self.queue.run(task, inline=inline)

        work = Work(f"{op.label} #{seq} (group {self.id})", launch)

        def task() -> None:
            self._execute(seq, me, op, sig, body, work)

        return work

    def _execute(
        self,
        seq: int,
        me: int,
        op: OpCode,
        sig: OpSig,
        body: Callable[[OpContext], Any],
        work: Work,
    ) -> None:
        cfg = self.group.config
        ctx = self.context(seq, me, op, sig, time.monotonic() + cfg.timeout)
        with self._lock:
            early = self._broken_error(ctx) or self._early_aborts.pop(seq, None)
            if early is None:
                self._inflight[seq] = ctx
        if early is not None:
            work._finish(error=early)
            with self._lock:
                self._done = max(self._done, seq)
            return
        try:
            self._scan_buffered(ctx)
            result = body(ctx)
            if op in ROOTED and cfg.check_mismatch and self.size > 1 and not ctx.all_pairs_checked:
                Confirmation(ctx, self._check_context(ctx)).finish()
        except CommunicationError as exc:
            err = ctx.named(exc)
            self.fail(ctx, err)
            work._finish(error=err)
        except BaseException as exc:
            self.fail(ctx, CommunicationError(f"{ctx.name} failed locally: {exc!r}"))
            work._finish(error=exc)
        else:
            work._finish(result)
        finally:
            with self._lock:
                self._inflight.pop(seq, None)
                self._notices.pop(seq, None)
                self._done = max(self._done, seq)

    def context(self, seq: int, me: int, op: OpCode, sig: OpSig, deadline: float) -> OpContext:
        """Operation ``seq``'s context (the lane builds one only when its call fails)."""
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
        return ctx

    def _check_context(self, ctx: OpContext) -> OpContext:
        """A context for the signature confirmation, aborted whenever ``ctx`` is."""
        check = OpContext(
            self.rt.router,
            op=OpCode.CHECK,
            group_id=self.id,
            seq=ctx.seq,
            ranks=self.ranks,
            rank=ctx.rank,
            sig=OpSig(op=int(OpCode.CHECK)),
            deadline=ctx.deadline,
            timeout=ctx.timeout,
            segment_bytes=1 << 16,
            tag_base=1 << 31,
        )
        check.data_sig = ctx.sig
        check.diagnose = self._diagnose_timeout
        with self._lock:
            ctx.companion = check
            late = ctx._aborted
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
                    "message": str(exc),
                    "origin": self.rt.rank,
                }
            ).encode()
        for peer in self.ranks:
            if peer != self.rt.rank:
                self.rt.send_control(peer, Control.ABORT, payload)

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
        for peer in self.ranks:
            if peer != me:
                self.rt.send_control(peer, Control.ABORT, payload)
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
            lane = self.lane
            if lane is not None and lane.seq == seq:  # the lane's call has no context
                lane.foreign.append((peer, sig))
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
        self.group.mark_broken(exc)
        with self._lock:
            running = list(self._inflight.values())
        for ctx in running:
            ctx.abort(exc)

    def close(self) -> None:
        self.queue.close()
