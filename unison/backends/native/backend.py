"""The ``native`` backend: unison's own algorithms over its own transports.

Each method picks an algorithm by cost (:meth:`Runtime.choose`), wraps its ``run``
in a body and submits it to the group's :class:`Executor`, which numbers it,
carries its signature for desync detection and spreads failures to every member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import OpCode, ReduceOp
from ...algorithms import OpContext, gather_scatter_linear
from ...algorithms import barrier_dissemination as barrier_algo
from ...buffers import Buffer, DType, finalize_average, kernel
from ...buffers.pieces import pieces_pair
from .p2p import post_recv, post_send
from .slot_collectives import slot_body, slots_for, small_all_gather, small_reduce_scatter

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...comm.group import Group
    from ...comm.work import Work
    from .executor import Executor
    from .runtime import Runtime

__all__ = ["NativeBackend"]


class NativeBackend:
    """The Backend of a native :class:`Runtime`: each call picks its algorithm and
    submits it to the group's :class:`Executor`."""

    name = "native"
    accepts_device_buffers = False
    checks_signatures = True

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def _choose(self, comm: Group, coll: str, nbytes: int) -> Any:
        return self.rt.choose(coll, comm.size, nbytes, comm).module

    def _ex(self, comm: Group) -> Executor:
        return self.rt.executors[comm.id]

    def broadcast(self, comm: Group, b: Buffer, root: int) -> Work:
        ex = self._ex(comm)
        sig = ex.sig(OpCode.BROADCAST, b.sig_dtype, b.count, root=comm.ranks[root])
        slots = slots_for(self.rt, comm, b.nbytes)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.broadcast(b.array, root, timeout, key)

            return ex.submit(OpCode.BROADCAST, sig, slot_body(self.rt, s, sig, run), on_slots=True)
        algo = self._choose(comm, "broadcast", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, root, ctx.seg_count(b.dtype))

        return ex.submit(OpCode.BROADCAST, sig, body)

    def all_reduce(self, comm: Group, b: Buffer, op: ReduceOp) -> Work:
        ex = self._ex(comm)
        sig = ex.sig(OpCode.ALL_REDUCE, b.sig_dtype, b.count, redop=op)
        slots = slots_for(self.rt, comm, b.nbytes)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.all_reduce(b.array, op, timeout, key, b.dtype)

            return ex.submit(OpCode.ALL_REDUCE, sig, slot_body(self.rt, s, sig, run), on_slots=True)
        kern = kernel(op, b.dtype)
        algo = self._choose(comm, "all_reduce", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, kern, op, b.dtype, ctx.seg_count(b.dtype))

        return ex.submit(OpCode.ALL_REDUCE, sig, body)

    def all_reduce_pieces(
        self,
        comm: Group,
        srcs: Sequence[np.ndarray],
        dsts: Sequence[np.ndarray],
        dtype: DType,
        op: ReduceOp,
        finish: Callable[[np.ndarray], None] | None,
    ) -> Work | None:
        nbytes = sum(a.nbytes for a in srcs)
        if comm.size < 2 or slots_for(self.rt, comm, nbytes) is not None:
            return None
        # only the shared-memory algorithms read and write the pieces where they lie
        # (they copy through the shared slots anyway); the others take one buffer
        run_pieces = getattr(self._choose(comm, "all_reduce", nbytes), "run_pieces", None)
        if run_pieces is None:
            return None
        pair = pieces_pair(srcs, dsts)
        if pair is None:
            return None
        src, dst = pair
        ex = self._ex(comm)
        sig = ex.sig(OpCode.ALL_REDUCE, dtype, src.count, redop=op)
        kern = kernel(op, dtype)

        def body(ctx: OpContext) -> None:
            run_pieces(ctx, src, dst, kern, op, dtype, finish)

        return ex.submit(OpCode.ALL_REDUCE, sig, body)

    def reduce(self, comm: Group, b: Buffer, root: int, op: ReduceOp) -> Work:
        ex = self._ex(comm)
        kern = kernel(op, b.dtype)
        algo = self._choose(comm, "reduce", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, root, kern, op, b.dtype, ctx.seg_count(b.dtype))

        sig = ex.sig(OpCode.REDUCE, b.sig_dtype, b.count, redop=op, root=comm.ranks[root])
        return ex.submit(OpCode.REDUCE, sig, body)

    def all_gather(self, comm: Group, b: Buffer, outs: list[np.ndarray], result: Any) -> Work:
        ex = self._ex(comm)
        sig = ex.sig(OpCode.ALL_GATHER, b.sig_dtype, b.count)
        slots = slots_for(self.rt, comm, b.nbytes)
        if slots is not None:
            run = small_all_gather(slots, b, outs, result)
            return ex.submit(
                OpCode.ALL_GATHER, sig, slot_body(self.rt, slots, sig, run), on_slots=True
            )
        algo = self._choose(comm, "all_gather", b.nbytes * comm.size)
        me = comm.rank
        assert me is not None

        def body(ctx: OpContext) -> Any:
            if not np.shares_memory(outs[me], b.array):
                outs[me][:] = b.array
            algo.run(ctx, outs, ctx.seg_count(b.dtype))
            return result

        return ex.submit(OpCode.ALL_GATHER, sig, body)

    def gather(
        self,
        comm: Group,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        ex = self._ex(comm)

        def body(ctx: OpContext) -> None:
            gather_scatter_linear.gather(ctx, b.array, outs, root)

        sig = ex.sig(OpCode.GATHER, b.sig_dtype, b.count, root=comm.ranks[root])
        return ex.submit(OpCode.GATHER, sig, body)

    def scatter(
        self,
        comm: Group,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        ex = self._ex(comm)

        def body(ctx: OpContext) -> None:
            gather_scatter_linear.scatter(ctx, b.array, ins, root)

        sig = ex.sig(OpCode.SCATTER, b.sig_dtype, b.count, root=comm.ranks[root])
        return ex.submit(OpCode.SCATTER, sig, body)

    def reduce_scatter(
        self,
        comm: Group,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
    ) -> Work:
        ex = self._ex(comm)
        sig = ex.sig(OpCode.REDUCE_SCATTER, out.sig_dtype, out.count, redop=op)
        slots = slots_for(self.rt, comm, out.nbytes * comm.size)
        if slots is not None:
            run = small_reduce_scatter(slots, out, ins, op, out.dtype)
            return ex.submit(
                OpCode.REDUCE_SCATTER, sig, slot_body(self.rt, slots, sig, run), on_slots=True
            )
        kern = kernel(op, out.dtype)
        algo = self._choose(comm, "reduce_scatter", out.nbytes * comm.size)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, ins, out.array, kern, ctx.seg_count(out.dtype))
            if op is ReduceOp.AVG:
                finalize_average(out.array, out.dtype, ctx.size)

        return ex.submit(OpCode.REDUCE_SCATTER, sig, body)

    def all_to_all(
        self,
        comm: Group,
        outs: list[np.ndarray],
        ins: list[np.ndarray],
        result: Any,
        ref: Buffer | None = None,
    ) -> Work:
        ex = self._ex(comm)
        algo = self._choose(comm, "all_to_all", sum(int(x.nbytes) for x in ins))

        def body(ctx: OpContext) -> Any:
            algo.run(ctx, outs, ins)
            return result

        sig = ex.sig(OpCode.ALL_TO_ALL, ref.sig_dtype if ref is not None else 0)
        return ex.submit(OpCode.ALL_TO_ALL, sig, body)

    def barrier(self, comm: Group) -> Work:
        ex = self._ex(comm)
        sig = ex.sig(OpCode.BARRIER)
        slots = slots_for(self.rt, comm, 0)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.barrier(timeout, key)

            return ex.submit(OpCode.BARRIER, sig, slot_body(self.rt, s, sig, run), on_slots=True)

        def body(ctx: OpContext) -> None:
            barrier_algo.run(ctx)

        return ex.submit(OpCode.BARRIER, sig, body)

    def isend(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        return post_send(self._ex(comm), b, peer, tag)

    def irecv(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        # its result is what torch.distributed's irecv Work holds: the tensor
        return post_recv(self._ex(comm), b, peer, tag)

    def new_group(self, gid: int, ranks: Sequence[int], timeout: float) -> None:
        """The runtime makes each group's :class:`Executor` (:meth:`Runtime.new_group`)."""

    def close(self) -> None:
        """The runtime closes its executors and transports."""
