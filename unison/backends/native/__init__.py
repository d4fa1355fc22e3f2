"""The ``native`` backend: unison's own algorithms over its own transports.

Each method picks an algorithm by cost (:func:`unison.algorithms.choose`), wraps its
``run`` in a body and submits it to the group's ordered engine
(:meth:`Communicator.submit`), which numbers it, carries its signature for desync
detection and spreads failures to every member.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import ReduceOp
from ...algorithms import OpCode, OpContext, linear
from ...algorithms import barrier_dissemination as barrier_algo
from ...buffers import Buffer, finalize_average, kernel
from ...config import Config
from ...jobenv import detect_job
from ...log import set_rank
from .runtime import Runtime
from .small import slots_for, small_all_gather, small_body, small_reduce_scatter

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...comm.communicator import Communicator
    from ...comm.work import Work

__all__ = ["NATIVE", "NativeBackend", "open_runtime"]


def _choose(comm: Communicator, coll: str, nbytes: int) -> Any:
    return comm.rt.choose(coll, comm.size, nbytes, comm).module


class NativeBackend:
    name = "native"
    accepts_device_buffers = False
    checks_signatures = True

    def broadcast(self, comm: Communicator, b: Buffer, root: int) -> Work:
        sig = comm.sig(OpCode.BROADCAST, b.dtype, b.count, root=comm.ranks[root])
        slots = slots_for(comm, b.nbytes)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.broadcast(b.array, root, timeout, key)

            return comm.submit(OpCode.BROADCAST, sig, small_body(comm, s, sig, run))
        algo = _choose(comm, "broadcast", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, root, ctx.seg_count(b.dtype))

        return comm.submit(OpCode.BROADCAST, sig, body)

    def all_reduce(self, comm: Communicator, b: Buffer, op: ReduceOp) -> Work:
        sig = comm.sig(OpCode.ALL_REDUCE, b.dtype, b.count, redop=op)
        slots = slots_for(comm, b.nbytes)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.all_reduce(b.array, op, timeout, key, b.dtype)

            return comm.submit(OpCode.ALL_REDUCE, sig, small_body(comm, s, sig, run))
        kern = kernel(op, b.dtype)
        algo = _choose(comm, "allreduce", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, kern, op, b.dtype, ctx.seg_count(b.dtype))

        return comm.submit(OpCode.ALL_REDUCE, sig, body)

    def reduce(self, comm: Communicator, b: Buffer, root: int, op: ReduceOp) -> Work:
        kern = kernel(op, b.dtype)
        algo = _choose(comm, "reduce", b.nbytes)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, b.array, root, kern, op, b.dtype, ctx.seg_count(b.dtype))

        sig = comm.sig(OpCode.REDUCE, b.dtype, b.count, redop=op, root=comm.ranks[root])
        return comm.submit(OpCode.REDUCE, sig, body)

    def all_gather(
        self, comm: Communicator, b: Buffer, outs: list[np.ndarray], result: Any
    ) -> Work:
        sig = comm.sig(OpCode.ALL_GATHER, b.dtype, b.count)
        slots = slots_for(comm, b.nbytes)
        if slots is not None:
            run = small_all_gather(slots, b, outs, result)
            return comm.submit(OpCode.ALL_GATHER, sig, small_body(comm, slots, sig, run))
        algo = _choose(comm, "allgather", b.nbytes * comm.size)
        me = comm.rank
        assert me is not None

        def body(ctx: OpContext) -> Any:
            if not np.shares_memory(outs[me], b.array):
                outs[me][:] = b.array
            algo.run(ctx, outs, ctx.seg_count(b.dtype))
            return result

        return comm.submit(OpCode.ALL_GATHER, sig, body)

    def gather(
        self,
        comm: Communicator,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        def body(ctx: OpContext) -> None:
            linear.gather(ctx, b.array, outs, root)

        sig = comm.sig(OpCode.GATHER, b.dtype, b.count, root=comm.ranks[root])
        return comm.submit(OpCode.GATHER, sig, body)

    def scatter(
        self,
        comm: Communicator,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        def body(ctx: OpContext) -> None:
            linear.scatter(ctx, b.array, ins, root)

        sig = comm.sig(OpCode.SCATTER, b.dtype, b.count, root=comm.ranks[root])
        return comm.submit(OpCode.SCATTER, sig, body)

    def reduce_scatter(
        self,
        comm: Communicator,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
    ) -> Work:
        sig = comm.sig(OpCode.REDUCE_SCATTER, out.dtype, out.count, redop=op)
        slots = slots_for(comm, out.nbytes * comm.size)
        if slots is not None:
            run = small_reduce_scatter(slots, out, ins, op, out.dtype)
            return comm.submit(OpCode.REDUCE_SCATTER, sig, small_body(comm, slots, sig, run))
        kern = kernel(op, out.dtype)
        algo = _choose(comm, "reduce_scatter", out.nbytes * comm.size)

        def body(ctx: OpContext) -> None:
            algo.run(ctx, ins, out.array, kern, ctx.seg_count(out.dtype))
            if op is ReduceOp.AVG:
                finalize_average(out.array, out.dtype, ctx.size)

        return comm.submit(OpCode.REDUCE_SCATTER, sig, body)

    def all_to_all(
        self,
        comm: Communicator,
        outs: list[np.ndarray],
        ins: list[np.ndarray],
        result: Any,
        ref: Buffer | None = None,
    ) -> Work:
        algo = _choose(comm, "alltoall", sum(int(x.nbytes) for x in ins))

        def body(ctx: OpContext) -> Any:
            algo.run(ctx, outs, ins)
            return result

        sig = comm.sig(OpCode.ALL_TO_ALL, ref.dtype if ref is not None else 0)
        return comm.submit(OpCode.ALL_TO_ALL, sig, body)

    def barrier(self, comm: Communicator) -> Work:
        sig = comm.sig(OpCode.BARRIER)
        slots = slots_for(comm, 0)
        if slots is not None:
            s = slots

            def run(timeout: float, key: int) -> None:
                s.barrier(timeout, key)

            return comm.submit(OpCode.BARRIER, sig, small_body(comm, s, sig, run))

        def body(ctx: OpContext) -> None:
            barrier_algo.run(ctx)

        return comm.submit(OpCode.BARRIER, sig, body)

    def isend(self, comm: Communicator, b: Buffer, peer: int, tag: int) -> Work:
        return comm.post_send(b, peer, tag)

    def irecv(self, comm: Communicator, b: Buffer, peer: int, tag: int) -> Work:
        # its result is what torch.distributed's irecv Work holds: the tensor
        return comm.post_recv(b, peer, tag)

    def new_group(self, gid: int, ranks: Sequence[int]) -> None:
        """Native groups need nothing beyond their :class:`Communicator`."""

    def close(self) -> None:
        """The native runtime closes its own transports."""


#: the one instance (stateless: state lives in the runtime and its communicators)
NATIVE = NativeBackend()


def open_runtime(
    config: Config,
    *,
    rank: int | None = None,
    size: int | None = None,
    store_addr: str | tuple[str, int] | None = None,
    secret: bytes | str | None = None,
) -> Runtime:
    """Join the job on unison's own engine: who we are (``unison run``, torchrun, mpirun,
    Slurm or explicit arguments), then the store, the mesh and the world group."""
    if isinstance(store_addr, str):
        host, _, port = store_addr.rpartition(":")
        store_addr = (host, int(port))
    if isinstance(secret, str):
        secret = bytes.fromhex(secret)
    job = detect_job(os.environ, rank=rank, size=size, store_addr=store_addr, secret=secret)
    set_rank(job.rank)
    rt = Runtime(job, config, NATIVE)
    try:
        rt.start()
    except BaseException:
        rt.close()
        raise
    return rt
