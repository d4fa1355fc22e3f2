"""The ``mpi`` backend: every operation on mpi4py, for jobs started by mpirun or srun.

Buffers go through mpi4py's buffer interface (no pickling): data movement as bytes,
reductions typed so MPI's own operators do the arithmetic (``AVG`` is ``SUM`` then a
division, as MPI has no average). Every call is nonblocking underneath (``Iallreduce``,
``Ibcast``, ...): a blocking unison call waits on the request within the job's
timeout, so a lost rank gives a :class:`CollectiveTimeoutError`, not a hang. Groups
are ``Split`` sub-communicators of a private duplicate of ``COMM_WORLD``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._types import ReduceOp
from .._version import install_hint
from ..buffers import Buffer, DType, finalize_average
from ..comm.group import ANY_SOURCE
from ..comm.work import Work
from ..errors import MismatchError, UnsupportedError
from ..jobenv import from_openmpi, from_pmi, from_slurm
from .base import (
    BackendRuntime,
    check_launch,
    check_launch_alone,
    comm_error,
    pack,
    poll_work,
    raw,
    unpack,
)

if TYPE_CHECKING:
    from ..comm.group import Group
    from ..config import Config

__all__ = ["MPIBackend", "open_runtime"]


class MPIBackend:
    name = "mpi"
    accepts_device_buffers = False
    checks_signatures = False

    def __init__(self, config: Config) -> None:
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise UnsupportedError(
                f"the mpi backend needs mpi4py and an MPI library: {install_hint('mpi')}"
            ) from exc
        self.MPI: Any = MPI
        self.timeout = config.timeout
        self.world: Any = MPI.COMM_WORLD.Dup()
        self.comms: dict[int, Any] = {0: self.world}
        self.tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767)
        m = MPI
        self._ops = {
            ReduceOp.SUM: m.SUM,
            ReduceOp.AVG: m.SUM,
            ReduceOp.PRODUCT: m.PROD,
            ReduceOp.MIN: m.MIN,
            ReduceOp.MAX: m.MAX,
            ReduceOp.BAND: m.BAND,
            ReduceOp.BOR: m.BOR,
            ReduceOp.BXOR: m.BXOR,
        }
        self._bool_ops = {
            ReduceOp.SUM: m.LOR,
            ReduceOp.PRODUCT: m.LAND,
            ReduceOp.MIN: m.LAND,
            ReduceOp.MAX: m.LOR,
            ReduceOp.BAND: m.LAND,
            ReduceOp.BOR: m.LOR,
            ReduceOp.BXOR: m.LXOR,
        }

    # --- helpers ---------------------------------------------------------------------------
    def identity(self) -> tuple[int, int, tuple[int, int, int, int]]:
        w = self.world
        node = w.Split_type(self.MPI.COMM_TYPE_SHARED, key=w.Get_rank())
        local = (node.Get_rank(), node.Get_size())
        node.Free()
        names = w.allgather(self.MPI.Get_processor_name())
        hosts = list(dict.fromkeys(names))
        return w.Get_rank(), w.Get_size(), (*local, hosts.index(names[w.Get_rank()]), len(hosts))

    def _c(self, comm: Group) -> Any:
        return self.comms[comm.id]

    def _op(self, op: ReduceOp, b: Buffer) -> Any:
        if b.dtype is DType.BFLOAT16:
            raise UnsupportedError("the mpi backend cannot reduce bfloat16 (MPI has no such type)")
        return (self._bool_ops if b.dtype is DType.BOOL else self._ops)[op]

    def _run(
        self,
        comm: Group,
        what: str,
        start: Callable[[], list[Any]],
        done: Callable[[], Any] | None = None,
    ) -> Work:
        name = f"{what} (group {comm.id}, mpi)"
        try:
            reqs = start()
        except self.MPI.Exception as exc:
            raise comm_error("mpi", name, exc) from exc
        Testall = self.MPI.Request.Testall
        # mpi4py's nonblocking calls keep no reference to the buffers they read and write:
        # the poll holds ``start`` (whose closure holds them all) until the requests finish,
        # or a temporary (reduce_scatter's concatenated input, a packed scatter or
        # all_to_all send buffer) is freed and its memory reused while MPI still reads it
        inflight = (reqs, start)
        work = poll_work(
            name,
            lambda: bool(Testall(inflight[0])),
            comm.config.timeout,
            lambda e: comm_error("mpi", name, e),
            done,
            on_error=comm.mark_broken,
        )
        return work

    # --- collectives -----------------------------------------------------------------------
    def broadcast(self, comm: Group, b: Buffer, root: int) -> Work:
        c = self._c(comm)
        return self._run(comm, "broadcast", lambda: [c.Ibcast(raw(b.array), root)])

    def all_reduce(self, comm: Group, b: Buffer, op: ReduceOp) -> Work:
        c, mop = self._c(comm), self._op(op, b)
        done = None
        if op is ReduceOp.AVG:
            done = lambda: finalize_average(b.array, b.dtype, comm.size)
        return self._run(
            comm,
            "all_reduce",
            lambda: [c.Iallreduce(self.MPI.IN_PLACE, b.array, mop)],
            done,
        )

    def all_reduce_pieces(self, *args: Any) -> None:
        """None: the caller packs the arrays into one buffer (mpi4py reduces one buffer)."""
        return None

    def reduce(self, comm: Group, b: Buffer, root: int, op: ReduceOp) -> Work:
        c, mop = self._c(comm), self._op(op, b)
        mine = comm.rank == root

        def start() -> list[Any]:
            if mine:
                return [c.Ireduce(self.MPI.IN_PLACE, b.array, mop, root)]
            return [c.Ireduce(b.array, None, mop, root)]

        done = None
        if op is ReduceOp.AVG and mine:
            done = lambda: finalize_average(b.array, b.dtype, comm.size)
        return self._run(comm, "reduce", start, done)

    def all_gather(self, comm: Group, b: Buffer, outs: list[np.ndarray], result: Any) -> Work:
        c = self._c(comm)
        tmp = np.empty(b.nbytes * comm.size, np.uint8)

        def done() -> Any:
            unpack(tmp, outs)
            return result

        return self._run(comm, "all_gather", lambda: [c.Iallgather(raw(b.array), tmp)], done)

    def gather(
        self,
        comm: Group,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        c = self._c(comm)
        tmp = np.empty(b.nbytes * comm.size if outs is not None else 0, np.uint8)

        def done() -> None:
            unpack(tmp, outs or [])

        recv = tmp if outs is not None else None
        return self._run(comm, "gather", lambda: [c.Igather(raw(b.array), recv, root)], done)

    def scatter(
        self,
        comm: Group,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        c = self._c(comm)
        send = pack(ins) if ins is not None else None
        return self._run(comm, "scatter", lambda: [c.Iscatter(send, raw(b.array), root)])

    def reduce_scatter(
        self,
        comm: Group,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
    ) -> Work:
        c, mop = self._c(comm), self._op(op, out)
        send = np.concatenate(ins) if ins else np.empty(0, out.array.dtype)
        done = None
        if op is ReduceOp.AVG:
            done = lambda: finalize_average(out.array, out.dtype, comm.size)
        return self._run(
            comm,
            "reduce_scatter",
            lambda: [c.Ireduce_scatter_block(send, out.array, mop)],
            done,
        )

    def all_to_all(
        self,
        comm: Group,
        outs: list[np.ndarray],
        ins: list[np.ndarray],
        result: Any,
        ref: Buffer | None = None,
    ) -> Work:
        c = self._c(comm)
        send = pack(ins)
        scounts = [int(x.nbytes) for x in ins]
        rcounts = [int(x.nbytes) for x in outs]
        recv = np.empty(sum(rcounts), np.uint8)
        sdispl = list(np.cumsum([0, *scounts[:-1]]).astype(int))
        rdispl = list(np.cumsum([0, *rcounts[:-1]]).astype(int))

        def done() -> Any:
            unpack(recv, outs)
            return result

        byte = self.MPI.BYTE
        return self._run(
            comm,
            "all_to_all",
            lambda: [
                c.Ialltoallv([send, (scounts, sdispl), byte], [recv, (rcounts, rdispl), byte])
            ],
            done,
        )

    def barrier(self, comm: Group) -> Work:
        c = self._c(comm)
        return self._run(comm, "barrier", lambda: [c.Ibarrier()])

    # --- point-to-point ----------------------------------------------------------------------
    def _tag(self, tag: int) -> int:
        if tag > self.tag_ub:
            raise UnsupportedError(f"the mpi backend's tags stop at {self.tag_ub}; got {tag}")
        return tag

    def isend(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        c, dest, t = self._c(comm), comm.ranks.index(peer), self._tag(tag)
        name = f"send to rank {peer} (tag {tag}, mpi)"
        try:
            req = c.Isend(raw(b.array), dest, t)
        except self.MPI.Exception as exc:
            raise comm_error("mpi", name, exc) from exc
        return poll_work(name, req.Test, comm.config.timeout, lambda e: comm_error("mpi", name, e))

    def irecv(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        c, t = self._c(comm), self._tag(tag)
        anyone = peer == ANY_SOURCE
        src = self.MPI.ANY_SOURCE if anyone else comm.ranks.index(peer)
        name = f"recv from {'any rank' if anyone else f'rank {peer}'} (tag {tag}, mpi)"
        status = self.MPI.Status()
        try:
            req = c.Irecv(raw(b.array), src, t)
        except self.MPI.Exception as exc:
            raise comm_error("mpi", name, exc) from exc

        def sender() -> int:
            """The sender's global rank (the status names its rank in the communicator)."""
            return int(comm.ranks[status.Get_source()]) if anyone else peer

        def done() -> Any:
            got = status.Get_count(self.MPI.BYTE)
            if got != b.nbytes:
                who = sender()
                raise MismatchError(
                    f"{name}: rank {who} sent {got} bytes but rank {comm.global_rank} expects "
                    f"{b.nbytes}",
                    op=name,
                    ranks=(who, comm.global_rank),
                )
            return b.source

        def translate(e: BaseException) -> BaseException:
            if "truncat" in str(e).lower():
                who = "any rank" if anyone else f"rank {peer}"
                return MismatchError(
                    f"{name}: the message from {who} is larger than the {b.nbytes}-byte buffer",
                    op=name,
                    ranks=(comm.global_rank,) if anyone else (peer, comm.global_rank),
                )
            return comm_error("mpi", name, e)

        return poll_work(
            name,
            lambda: bool(req.Test(status)),
            comm.config.timeout,
            translate,
            done,
            source=sender,
        )

    # --- groups ----------------------------------------------------------------------------------
    def new_group(self, gid: int, ranks: Sequence[int], timeout: float) -> None:
        me = self.world.Get_rank()
        color = 0 if me in ranks else self.MPI.UNDEFINED
        self.comms[gid] = self.world.Split(color, me)

    def close(self) -> None:
        for c in self.comms.values():
            if c != self.MPI.COMM_NULL:
                try:
                    c.Free()
                except self.MPI.Exception:
                    pass
        self.comms.clear()


def open_runtime(config: Config) -> BackendRuntime:
    if not any(f(os.environ) for f in (from_openmpi, from_pmi, from_slurm)):
        # no MPI launcher started this process: MPI would make a world of one (a
        # singleton, which leaves Open MPI's shared-memory file behind), so a larger job
        # is refused before MPI starts
        check_launch_alone("mpi")
    be = MPIBackend(config)
    rank, size, local = be.identity()
    check_launch("mpi", rank, size)
    return BackendRuntime(be, config, rank, size, local)
