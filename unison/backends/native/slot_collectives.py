"""Small collectives over the shared slots (:mod:`unison.transport.seqslot`).

When every rank of the job shares one host, a collective of the world or of one of the
first sub-groups (``UNISON_GROUP_SLOTS``, 8 by default) whose payload fits a slot
(``UNISON_SMALL_BYTES``, 1 MiB by default; a sub-group's slot holds 64 KiB at most)
skips the algorithms, requests, framing and matching: each rank publishes its bytes and
signature in its slot and reads its peers'. Such a call reaches the slots two ways, as one
operation:

- *queued* (an async call, or one issued while the group is busy): a numbered
  operation of the group's :class:`~.executor.Executor` like any other (:func:`slot_body`);
  failures take the usual way through its :class:`OpContext`;
- *in the caller's thread* (a blocking call while nothing else of the group is in
  flight): the executor runs a :class:`SlotCall` prepared once per signature
  (:func:`prepare_call`) straight on the slots, with no Work, queue, context,
  algorithm choice, framing or matching (:meth:`Executor.run`).

Both take the group's next sequence number, publish the same signature word and run
the same :class:`SeqSlots` code, so a rank on one way and a peer on the other meet in
the slots and compute the same bytes. A disagreeing signature is a
:class:`MismatchError` on every rank, a silent peer a :class:`CollectiveTimeoutError`
naming it, and the group's ABORT spreads either (the errors are worded by
:class:`OpContext`).

Every rank picks this path for the same calls: the choice depends on the group
(its id, below ``UNISON_GROUP_SLOTS``), the payload size (part of the signature every
rank must agree on) and whether the job has the slots (agreed by the fabric), never on
local timing. If ranks disagree on size across the threshold, the general-path rank's
frame reaches the slot rank as a foreign frame and both fail with the mismatch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import OpCode, OpSig, ReduceOp
from ...algorithms import OpContext
from ...buffers import Buffer, DType, check_op
from ...errors import CommunicationError, UnisonError
from ...transport.seqslot import SeqSlots, SlotPlan

if TYPE_CHECKING:
    from ...comm.group import Group
    from .executor import Executor
    from .runtime import Runtime

__all__ = [
    "SlotCall",
    "arena_sync",
    "prepare_call",
    "signature_word",
    "slot_body",
    "slots_for",
    "small_all_gather",
    "small_reduce_scatter",
]

_B8, _B16 = 0xFF, 0xFFFF
_NAME = {
    OpCode.ALL_REDUCE: "all_reduce",
    OpCode.BROADCAST: "broadcast",
    OpCode.ALL_GATHER: "all_gather",
    OpCode.REDUCE_SCATTER: "reduce_scatter",
    OpCode.BARRIER: "barrier",
}


def slots_for(rt: Runtime, comm: Group, nbytes: int) -> SeqSlots | None:
    """The group's slots when this call may use them (the same answer on every rank).

    Never when ``UNISON_ALGO`` forces an algorithm: a forced algorithm runs (or is
    refused as ineligible) at every size, so the slots do not bypass it."""
    if rt.overrides:
        return None
    slots = rt.executors[comm.id].slots
    if slots is None or nbytes > slots.slot_bytes:
        return None
    return slots


def signature_word(sig: OpSig) -> int:
    """The whole signature in one signed 64-bit word (what the slots compare)."""
    return (
        (sig.op & 0x7F) << 56
        | (sig.dtype & _B8) << 48
        | (sig.redop & _B8) << 40
        | ((sig.root + 1) & _B16) << 24
        | (sig.count & 0xFFFFFF)
    )


def _signature_of(word: int) -> OpSig:
    root = ((word >> 24) & _B16) - 1
    return OpSig((word >> 56) & 0x7F, (word >> 48) & _B8, (word >> 40) & _B8, root, word & 0xFFFFFF)


class ContextWatch:
    """A slot call's view of its operation: the context's aborts, lost peers, and the
    context's wording of a timeout or a mismatch. ``context()`` gives the context (the
    caller-thread path builds one only when an error needs it); ``check()`` raises what
    failed elsewhere."""

    __slots__ = ("check", "context", "rt")

    def __init__(
        self, rt: Runtime, context: Callable[[], OpContext], check: Callable[[], None]
    ) -> None:
        self.rt, self.context, self.check = rt, context, check

    def late(self, pending: list[int]) -> BaseException:
        ctx = self.context()
        return ctx.timeout_error([ctx.ranks[q] for q in pending])

    def mismatch(self, peer: int, theirs: int) -> BaseException:
        ctx = self.context()
        return ctx.mismatch_error(ctx.ranks[peer], _signature_of(theirs))


def _queued_watch(rt: Runtime, ctx: OpContext) -> ContextWatch:
    others = [r for r in ctx.ranks if r != rt.rank]

    def check() -> None:
        ctx.raise_if_aborted()
        lost = rt.fabric.gone(others)
        if lost is not None:
            raise lost

    return ContextWatch(rt, lambda: ctx, check)


def _watched(
    rt: Runtime, slots: SeqSlots, ctx: OpContext, word: int, run: Callable[[float, int], Any]
) -> Any:
    """``run(timeout, word)`` on the slots with ``ctx``'s deadline, aborts and names."""
    slots.watch = _queued_watch(rt, ctx)
    try:
        return run(ctx.deadline - time.monotonic(), word)
    except CommunicationError as exc:
        raise ctx.named(exc) from None  # name the operation, as the general path does
    finally:
        slots.watch = None


def slot_body(
    rt: Runtime,
    slots: SeqSlots,
    sig: OpSig,
    run: Callable[[float, int], Any],
) -> Callable[[OpContext], Any]:
    """The queued operation's body: watch the context, ``run(timeout, word)`` on the slots."""
    word = signature_word(sig)

    def body(ctx: OpContext) -> Any:
        out = _watched(rt, slots, ctx, word, run)
        ctx.all_pairs_checked = True  # every rank compared every rank's signature
        return out

    return body


def _nbytes(sig: OpSig) -> int:
    try:
        return sig.count * DType(sig.dtype).itemsize
    except ValueError:
        return 0


def arena_sync(rt: Runtime, slots: SeqSlots) -> Callable[[OpContext, int], None]:
    """The direct shared-memory algorithms' round synchronisation as a slot barrier
    (one store and a few loads instead of 2(p−1) zero-byte messages)."""

    def sync(ctx: OpContext, step: int) -> None:
        # an operation of several full rounds keeps every rank copying for a while
        # between syncs; when ranks outnumber cores, the peer we wait for needs this
        # core: sleep on the futex at once instead of yielding in a loop
        slots.patient = slots.policy.oversubscribed and (
            _nbytes(ctx.sig) > getattr(ctx.topo.link, "half", 0) > 0
        )
        try:
            _watched(
                rt, slots, ctx, signature_word(ctx.sig), lambda t, k: slots.barrier(t, k, True)
            )
        finally:
            slots.patient = False

    return sync


def small_all_gather(
    slots: SeqSlots, b: Buffer, outs: list[np.ndarray], result: Any
) -> Callable[[float, int], Any]:
    def run(timeout: float, word: int) -> Any:
        slots.all_gather(b.array, outs, timeout, word)
        return result

    return run


def small_reduce_scatter(
    slots: SeqSlots, out: Buffer, ins: list[np.ndarray], op: ReduceOp, dt: DType
) -> Callable[[float, int], Any]:
    def run(timeout: float, word: int) -> None:
        slots.reduce_scatter(ins, out.array, op, timeout, word, dt)

    return run


# --- the caller-thread path: calls prepared once per signature ---------------------------
class SlotCall:
    """One signature's call on the slots, prepared once: its operation, signature,
    signature word and the slots' plan (views of every rank's slot for this shape)."""

    __slots__ = ("op", "plan", "sig", "word")

    def __init__(self, op: OpCode, sig: OpSig, plan: SlotPlan) -> None:
        self.op, self.sig, self.plan = op, sig, plan
        self.word = signature_word(sig)


def prepare_call(
    ex: Executor,
    slots: SeqSlots,
    op: OpCode,
    arr: np.ndarray,
    nbytes: int,
    dtype: DType,
    redop: ReduceOp | None = None,
    root: int = -1,
    gather_list: bool = False,
) -> SlotCall | None:
    """The call of a validated signature on ``ex``'s slots, or None when it does not fit
    them (``arr``: the buffer whose shape the slots' plan takes; ``root``: a global rank)."""
    if nbytes > slots.slot_bytes:
        return None
    if op is OpCode.BARRIER:
        sig = ex.sig(OpCode.BARRIER)
        return SlotCall(op, sig, slots.plan("barrier", (0,), np.dtype(np.uint8), DType.UINT8))
    rop = ReduceOp.SUM if redop is None else redop
    try:
        check_op(rop, dtype)
    except UnisonError:
        return None  # the general path raises the argument error
    sig = ex.sig(op, dtype, arr.size, redop=int(rop) if redop is not None else 0, root=root)
    local = ex.ranks.index(root) if root >= 0 else 0
    plan = slots.plan(_NAME[op], arr.shape, arr.dtype, dtype, rop, local, gather_list)
    return SlotCall(op, sig, plan)
