"""The blocking small-collective lane: validate once, write the slot, wait, reduce.

A blocking collective whose payload fits the group's slots
(:mod:`unison.transport.seqslot`), issued while nothing else of the group is queued
or running on this rank, needs none of the general path's machinery: no
:class:`~unison.comm.work.Work`, no ordered queue, no :class:`OpContext`, no
algorithm choice, framing or matching. :class:`Lane` runs such a call in the
caller's thread straight on the slots, and declines (the caller then takes the
general path) whenever anything else is in flight, a fault hook is installed, the
group is broken or the arguments are not the plain case it caches.

It is the same operation as the executor's slot path (:mod:`.small`), not a
different protocol: it takes the group's next sequence number, publishes the same
signature word and runs the same :class:`SeqSlots` code, so a rank on the lane and
a peer whose call went through its executor (an async call, a queued one) meet in
the slots and compute the same bytes. What the lane gives up it rebuilds only
when a call fails: the context, for the typed error naming the rank and the
operation, and the group's ABORT to every peer (:meth:`Executor.fail`).

Per-signature checks are cached: the first call of a (dtype, count, op, root)
validates everything and stores the signature word and the buffer type; later
calls with the same signature only test what can change between calls of one
signature (the array's type, contiguity, writability).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import ReduceOp
from ...algorithms import OpCode, OpContext
from ...buffers import Buffer, DType, check_op, from_numpy
from ...errors import CommunicationError, UnisonError
from .desync import foreign_frame_error
from .small import _key, _Watch

if TYPE_CHECKING:
    from ...transport.framing import OpSig
    from ...transport.seqslot import Plan as SlotPlan
    from ...transport.seqslot import SeqSlots
    from .executor import Executor
    from .runtime import Runtime

__all__ = ["Lane"]

#: a cached call signature: (opcode, OpSig, slot key word, the slots' plan)
_Plan = tuple[OpCode, "OpSig", int, "SlotPlan"]
_NAME = {
    OpCode.ALL_REDUCE: "all_reduce",
    OpCode.BROADCAST: "broadcast",
    OpCode.ALL_GATHER: "all_gather",
    OpCode.REDUCE_SCATTER: "reduce_scatter",
    OpCode.BARRIER: "barrier",
}


class _LaneWatch:
    """The slots' view of the lane's current call: failures learnt elsewhere (another
    rank's abort, a lost peer, a frame of another operation) and the errors' texts.
    The context behind the texts is built only when one is needed."""

    __slots__ = ("lane", "scanned")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.scanned = False

    def _watch(self) -> _Watch:
        return _Watch(self.lane.rt, self.lane.context())

    def check(self) -> None:
        lane = self.lane
        ex = lane.ex
        if ex._early_aborts:
            exc = ex._early_aborts.pop(lane.seq, None)
            if exc is not None:
                raise exc
        broken = ex.group.broken
        if broken is not None:
            raise broken
        lost = lane.rt.fabric.gone(lane.others)
        if lost is not None:
            raise lost
        if lane.check_mismatch:
            self._foreign()

    def _foreign(self) -> None:
        """Frames of this operation sent by a peer on the general path: a mismatch."""
        lane = self.lane
        found = lane.foreign
        if not self.scanned:  # those that arrived before this call began
            self.scanned = True
            for t in lane.rt.fabric.transports:
                found.extend(t.unexpected_sigs(lane.ex.id, lane.seq))
        if found:
            ctx = lane.context()
            for peer, sig in found:
                err = foreign_frame_error(ctx, peer, sig)
                if err is not None:
                    raise err

    def late(self, pending: list[int]) -> BaseException:
        return self._watch().late(pending)

    def mismatch(self, peer: int, theirs: int) -> BaseException:
        return self._watch().mismatch(peer, theirs)


class Lane:
    """One group's blocking small collectives on its slots (members only).

    Each method returns False, having done nothing, when the call is not the lane's
    (the caller then takes the general path, which also raises for bad arguments)."""

    def __init__(self, rt: Runtime, ex: Executor, slots: SeqSlots) -> None:
        self.rt, self.ex, self.slots = rt, ex, slots
        self.queue = ex.queue
        me = ex.group.rank
        assert me is not None
        self.me = me
        self.others = [r for r in ex.ranks if r != rt.rank]
        self.limit = slots.slot_bytes
        self.timeout = ex.group.config.timeout
        self.check_mismatch = rt.config.check_mismatch
        #: the sequence number of the call running now (0: none)
        self.seq = 0
        #: frames of the running call's operation that arrived from general-path peers
        self.foreign: list[tuple[int, OpSig]] = []
        self._plan: _Plan | None = None
        self._watch = _LaneWatch(self)
        self._plans: dict[tuple[Any, ...], _Plan | None] = {}

    # --- plans: what the first call of a signature validated --------------------------
    def _make(
        self,
        op: OpCode,
        arr: np.ndarray,
        nbytes: int,
        redop: Any = None,
        root: int = -1,
        dtype: DType | None = None,
        shape: tuple[int, ...] | None = None,
        gather_list: bool = False,
    ) -> _Plan | None:
        """``arr``: the buffer whose shape the slots' plan takes (``shape`` if given)."""
        dt = dtype or from_numpy(arr.dtype)
        if dt is None or nbytes > self.limit:
            return None
        rop = ReduceOp.SUM
        if redop is not None:
            try:
                rop = ReduceOp(redop)
                check_op(rop, dt)
            except (ValueError, TypeError, UnisonError):
                return None  # the general path raises the argument error
        sig = self.ex.sig(op, dt, arr.size, redop=int(rop) if redop is not None else 0, root=root)
        local = self.ex.ranks.index(root) if root >= 0 else 0
        slot = self.slots.plan(
            _NAME[op],
            arr.shape if shape is None else shape,
            arr.dtype,
            dt,
            rop,
            local,
            gather_list,
        )
        return (op, sig, _key(sig), slot)

    def _plan_for(self, key: tuple[Any, ...], make: Callable[[], _Plan | None]) -> _Plan | None:
        plans = self._plans
        if key in plans:
            return plans[key]
        if len(plans) > 512:
            plans.clear()
        plan = plans[key] = make()
        return plan

    # --- running one call ------------------------------------------------------------------
    def _go(self, plan: _Plan, inp: Any, out: Any) -> bool:
        """Run one call of ``plan`` on the slots if nothing else of the group is in flight
        here (False, having done nothing, otherwise): take the group's next sequence
        number, publish, wait, finish, and fail the group as the executor would if it
        fails. One method for what every collective does (each call here is a Python
        call fewer on the path)."""
        ex, q = self.ex, self.queue
        with ex._lock:
            if (
                ex._seq != ex._done
                or q._busy
                or q._queue
                or q._closed
                or ex.group._broken is not None
                or ex._early_aborts  # a peer already failed a call: the executor says so
                or self.rt.op_hook is not None
            ):
                return False
            ex._seq = seq = ex._seq + 1
            q._busy = True
        self.seq = seq
        self._plan = plan
        slots = self.slots
        slots.watch = self._watch
        try:
            slots.run(plan[3], inp, out, self.timeout, plan[2])
        except BaseException as exc:
            raise self._failed(exc) from None
        finally:
            slots.watch = None
            ex._done = seq
            self.seq = 0
            q._busy = False
            if q._queue:  # another thread queued work meanwhile: its worker waits for us
                with q._cv:
                    q._cv.notify_all()
            if self.foreign or self._watch.scanned:
                self.foreign = []
                self._watch.scanned = False
        return True

    def context(self) -> OpContext:
        """The running call's context, built for its errors only."""
        plan = self._plan
        assert plan is not None
        return self.ex.context(self.seq, self.me, plan[0], plan[1], 0.0)

    def _failed(self, exc: BaseException) -> BaseException:
        """Fail the running call as the executor fails one: break the group, tell every
        peer (ABORT); returns the error to raise."""
        ctx = self.context()
        if isinstance(exc, CommunicationError):
            err = ctx.named(exc)  # as the general path names it
            self.ex.fail(ctx, err)
            return err
        self.ex.fail(ctx, CommunicationError(f"{ctx.name} failed locally: {exc!r}"))
        return exc

    # --- the collectives ---------------------------------------------------------------------
    def all_reduce(self, arr: np.ndarray, op: Any) -> bool:
        plan = self._plans.get((0, arr.dtype, arr.shape, op))
        if plan is None:
            plan = self._plan_for(
                (0, arr.dtype, arr.shape, op),
                lambda: self._make(OpCode.ALL_REDUCE, arr, arr.nbytes, op),
            )
            if plan is None:
                return False
        flags = arr.flags
        if not (flags.c_contiguous and flags.writeable):
            return False
        return self._go(plan, arr, arr)

    def all_reduce_buffer(self, b: Buffer, op: ReduceOp) -> bool:
        """A validated buffer (a torch CPU tensor's storage, bfloat16 included)."""
        arr = b.array
        key = (5, b.dtype, arr.dtype, b.count, op)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan_for(
                key, lambda: self._make(OpCode.ALL_REDUCE, arr, arr.nbytes, op, dtype=b.dtype)
            )
            if plan is None:
                return False
        return self._go(plan, arr, arr)

    def broadcast(self, arr: np.ndarray, src: Any) -> bool:
        plan = self._plans.get((1, arr.dtype, arr.shape, src))
        if plan is None:
            if src not in self.ex.ranks:  # the caller passed an int (bool is not a rank)
                return False
            plan = self._plan_for(
                (1, arr.dtype, arr.shape, src),
                lambda: self._make(OpCode.BROADCAST, arr, arr.nbytes, root=src),
            )
            if plan is None:
                return False
        flags = arr.flags
        if not (flags.c_contiguous and flags.writeable):
            return False
        return self._go(plan, arr, arr)

    def all_gather(self, out: np.ndarray, inp: np.ndarray) -> bool:
        """``out``: one array of group size × ``inp`` elements (all_gather_into_tensor)."""
        plan = self._plans.get((2, inp.dtype, inp.shape, out.dtype, out.size))
        if plan is None:
            if out.dtype != inp.dtype or out.size != inp.size * self.ex.size:
                return False
            plan = self._plan_for(
                (2, inp.dtype, inp.shape, out.dtype, out.size),
                lambda: self._make(OpCode.ALL_GATHER, inp, inp.nbytes),
            )
            if plan is None:
                return False
        flags = out.flags
        if not (flags.c_contiguous and flags.writeable and inp.flags.c_contiguous):
            return False
        return self._go(plan, inp, out)

    def reduce_scatter(self, out: np.ndarray, inp: np.ndarray, op: Any) -> bool:
        """``inp``: one array of group size × ``out`` elements (reduce_scatter_tensor)."""
        plan = self._plans.get((3, out.dtype, out.shape, inp.dtype, inp.size, op))
        if plan is None:
            if out.dtype != inp.dtype or inp.size != out.size * self.ex.size:
                return False
            plan = self._plan_for(
                (3, out.dtype, out.shape, inp.dtype, inp.size, op),
                lambda: self._make(OpCode.REDUCE_SCATTER, out, inp.nbytes, op),
            )
            if plan is None:
                return False
        flags = out.flags
        if not (flags.c_contiguous and flags.writeable and inp.flags.c_contiguous):
            return False
        return self._go(plan, inp if inp.ndim == 1 else inp.reshape(-1), out)

    def all_gather_list(self, b: Buffer, outs: list[np.ndarray]) -> bool:
        """The list form, on validated buffers: the slots copy each rank's block
        straight into its entry of ``outs`` (what the executor's slot path runs)."""
        inp = b.array
        key = (6, b.dtype, inp.dtype, b.count)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan_for(
                key,
                lambda: self._make(
                    OpCode.ALL_GATHER, inp, inp.nbytes, dtype=b.dtype, gather_list=True
                ),
            )
            if plan is None:
                return False
        return self._go(plan, inp, outs)

    def reduce_scatter_list(self, out: Buffer, ins: list[np.ndarray], op: ReduceOp) -> bool:
        """The list form, on validated buffers: the slots take each block of ``ins``
        in place of one contiguous input (what the executor's slot path runs)."""
        arr = out.array
        key = (7, out.dtype, arr.dtype, out.count, op)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan_for(
                key,
                lambda: self._make(
                    OpCode.REDUCE_SCATTER, arr, arr.nbytes * self.ex.size, op, dtype=out.dtype
                ),
            )
            if plan is None:
                return False
        return self._go(plan, ins, arr)

    def barrier(self) -> bool:
        plan = self._plans.get((4,))
        if plan is None:
            plan = self._plan_for((4,), lambda: self._barrier_plan())
        return plan is not None and self._go(plan, None, None)

    def _barrier_plan(self) -> _Plan:
        sig = self.ex.sig(OpCode.BARRIER)
        slot = self.slots.plan("barrier", (0,), np.dtype(np.uint8), DType.UINT8)
        return (OpCode.BARRIER, sig, _key(sig), slot)
