"""Small collectives over the shared slots (:mod:`unison.transport.seqslot`).

When every rank of the job shares one host, a collective of the world or of one of the
first sub-groups (``UNISON_GROUP_SLOTS``, 8 by default) whose payload fits a slot
(``UNISON_SMALL_BYTES``, 4 KiB by default) skips the algorithms, requests, framing
and matching: each rank publishes its bytes and signature in its slot and reads its
peers'. It still runs as a numbered operation of the group's ordered
engine, so failures take the usual way: an abort or a lost peer reaches the
waiting rank through its :class:`OpContext`, a disagreeing signature is a
:class:`MismatchError` on every rank, a silent peer a
:class:`CollectiveTimeoutError` naming it, and the group's ABORT spreads either.

Every rank picks this path for the same calls: the choice depends on the group
(its id, below ``UNISON_GROUP_SLOTS``), the payload size (part of the signature every
rank must agree on) and whether the job has the slots (agreed by the fabric), never on
local timing.
If ranks disagree on size across the threshold, the general-path rank's frame
reaches the slot rank as a foreign frame and both fail with the mismatch.

A blocking call with nothing else in flight skips even the numbered-operation
machinery: :mod:`.lane` runs it on the same slots in the caller's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import OpSig, ReduceOp
from ...algorithms import OpContext, describe
from ...buffers import Buffer, DType
from ...errors import CollectiveTimeoutError, CommunicationError, MismatchError
from ...transport.seqslot import SeqSlots

if TYPE_CHECKING:
    from ...comm.group import Group
    from .runtime import Runtime

__all__ = ["arena_sync", "slots_for", "small_all_gather", "small_body", "small_reduce_scatter"]

_B8, _B16, _B32 = 0xFF, 0xFFFF, 0xFFFFFFFF


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


def _key(sig: OpSig) -> int:
    """The whole signature in one signed 64-bit word (what the slots compare)."""
    return (
        (sig.op & 0x7F) << 56
        | (sig.dtype & _B8) << 48
        | (sig.redop & _B8) << 40
        | ((sig.root + 1) & _B16) << 24
        | (sig.count & 0xFFFFFF)
    )


def _unkey(key: int) -> OpSig:
    root = ((key >> 24) & _B16) - 1
    return OpSig((key >> 56) & 0x7F, (key >> 48) & _B8, (key >> 40) & _B8, root, key & 0xFFFFFF)


class _Watch:
    """One call's view for the slots: its context's aborts, lost peers, error texts."""

    __slots__ = ("ctx", "rt")

    def __init__(self, rt: Runtime, ctx: OpContext) -> None:
        self.rt, self.ctx = rt, ctx

    def check(self) -> None:
        self.ctx._raise_if_aborted()
        lost = self.rt.fabric.gone([r for r in self.ctx.ranks if r != self.rt.rank])
        if lost is not None:
            raise lost

    def late(self, pending: list[int]) -> BaseException:
        ctx = self.ctx
        waiting = [ctx.ranks[q] for q in pending]
        silent, notes = ctx.diagnose(ctx, waiting) if ctx.diagnose else (waiting, [])
        text = (
            f"{ctx.name} timed out after {ctx.timeout:g}s: "
            f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} did not answer"
        )
        if silent != waiting:
            text += f" (rank {ctx.ranks[ctx.rank]} was waiting for {', '.join(map(str, waiting))})"
        if notes:
            text += "; " + "; ".join(notes)
        return CollectiveTimeoutError(
            text, op=ctx.op.label, seq=ctx.seq, group=ctx.group_id, ranks=silent
        )

    def mismatch(self, peer: int, theirs: int) -> BaseException:
        ctx = self.ctx
        other, me = ctx.ranks[peer], ctx.ranks[ctx.rank]
        return MismatchError(
            f"mismatched collective at {ctx.name}: rank {other} called "
            f"{describe(_unkey(theirs))} but rank {me} called {describe(ctx.sig)}",
            op=ctx.op.label,
            seq=ctx.seq,
            group=ctx.group_id,
            ranks=(other, me),
        )


def _watched(
    rt: Runtime, slots: SeqSlots, ctx: OpContext, key: int, run: Callable[[float, int], Any]
) -> Any:
    """``run(timeout, key)`` on the slots with ``ctx``'s deadline, aborts and names."""
    slots.watch = _Watch(rt, ctx)
    try:
        return run(ctx.deadline - time.monotonic(), key)
    except CommunicationError as exc:
        if exc.op is not None:
            raise
        raise type(exc)(  # name the operation, as the general path does
            f"{ctx.name}: {exc}",
            op=ctx.op.label,
            seq=ctx.seq,
            group=ctx.group_id,
            ranks=exc.ranks,
        ) from None
    finally:
        slots.watch = None


def small_body(
    rt: Runtime,
    slots: SeqSlots,
    sig: OpSig,
    run: Callable[[float, int], Any],
) -> Callable[[OpContext], Any]:
    """The engine body: watch the context, ``run(timeout, key)`` on the slots."""
    key = _key(sig)

    def body(ctx: OpContext) -> Any:
        out = _watched(rt, slots, ctx, key, run)
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
            _watched(rt, slots, ctx, _key(ctx.sig), lambda t, k: slots.barrier(t, k, True))
        finally:
            slots.patient = False

    return sync


def small_all_gather(
    slots: SeqSlots, b: Buffer, outs: list[np.ndarray], result: Any
) -> Callable[[float, int], Any]:
    def run(timeout: float, key: int) -> Any:
        slots.all_gather(b.array, outs, timeout, key)
        return result

    return run


def small_reduce_scatter(
    slots: SeqSlots, out: Buffer, ins: list[np.ndarray], op: ReduceOp, dt: DType
) -> Callable[[float, int], Any]:
    def run(timeout: float, key: int) -> None:
        slots.reduce_scatter(ins, out.array, op, timeout, key, dt)

    return run
