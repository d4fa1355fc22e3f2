"""One operation on one implementation: unison, torch.distributed (Gloo) or mpi4py.

A :class:`Case` owns the numpy buffers of one (operation, size) row; ``run()``
executes the operation once and ``check()`` fills the inputs with known values,
runs it and compares every output element with what it must be. The three
backends differ only in how they call the library; buffers, expected values and
timing are shared, so the comparison is like for like.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .spec import LIST_OPS, base_op

__all__ = ["Backend", "Case", "make_backend"]


def pattern(q: int, n: int, dtype: np.dtype) -> np.ndarray:
    """Rank ``q``'s input: small integers, so sums are exact in every dtype."""
    return ((np.arange(n) % 13) + q + 1).astype(dtype)


def _summed(p: int, start: int, n: int, dtype: np.dtype) -> np.ndarray:
    """Elements ``start:start+n`` of the sum of every rank's :func:`pattern` (exact)."""
    return (p * (np.arange(start, start + n) % 13) + p * (p + 1) // 2).astype(dtype)


class Case:
    """Buffers and the expected result of one operation at one size on one rank."""

    def __init__(self, op: str, count: int, dtype: np.dtype, rank: int, size: int) -> None:
        self.op, self.rank, self.size, self.dtype = op, rank, size, dtype
        op = base_op(op)  # a list form: the same buffers, its blocks views of them
        p, r = size, rank
        m = count // p if op in ("all_gather", "reduce_scatter", "all_to_all") else count
        self.count = m * p if op in ("all_gather", "reduce_scatter", "all_to_all") else m
        if op == "barrier":  # no payload
            m = self.count = 0
        self.nbytes = self.count * dtype.itemsize
        self.bufs: dict[str, np.ndarray] = {}
        if op in ("all_reduce", "broadcast"):
            self.bufs["x"] = np.zeros(m, dtype)
        elif op == "all_gather":
            self.bufs["inp"] = np.zeros(m, dtype)
            self.bufs["out"] = np.zeros(m * p, dtype)
        elif op in ("reduce_scatter", "all_to_all"):
            self.bufs["inp"] = np.zeros(m * p, dtype)
            self.bufs["out"] = np.zeros(m if op == "reduce_scatter" else m * p, dtype)
        elif op == "sendrecv":
            self.bufs["send"] = np.zeros(m, dtype)
            self.bufs["recv"] = np.zeros(m, dtype)
        self.m = m
        #: the list forms' blocks: contiguous views of the flat buffer, one per rank
        self.blocks: list[np.ndarray] = []
        if self.op == "all_gather_list":
            self.blocks = [self.bufs["out"][q * m : (q + 1) * m] for q in range(p)]
        elif self.op == "reduce_scatter_list":
            self.blocks = [self.bufs["inp"][q * m : (q + 1) * m] for q in range(p)]
        self.left, self.right = (r - 1) % p, (r + 1) % p
        self.run: Callable[[], None] = lambda: None

    def _fill(self) -> tuple[str, np.ndarray]:
        p, r, m, dt = self.size, self.rank, self.m, self.dtype
        op = base_op(self.op)
        if op == "all_reduce":
            self.bufs["x"][:] = pattern(r, m, dt)
            return "x", _summed(p, 0, m, dt)
        if op == "broadcast":
            self.bufs["x"][:] = pattern(r, m, dt) if r == 0 else 0
            return "x", pattern(0, m, dt)
        if op == "all_gather":
            self.bufs["inp"][:] = pattern(r, m, dt)
            return "out", np.concatenate([pattern(q, m, dt) for q in range(p)])
        if op == "reduce_scatter":
            self.bufs["inp"][:] = pattern(r, m * p, dt)
            full = sum((pattern(q, m * p, np.dtype(np.float64)) for q in range(p)), np.zeros(m * p))
            return "out", full[r * m : (r + 1) * m].astype(dt)
        if op == "all_to_all":
            self.bufs["inp"][:] = pattern(r, m * p, dt)
            return "out", np.concatenate(
                [pattern(q, m * p, dt)[r * m : (r + 1) * m] for q in range(p)]
            )
        self.bufs["send"][:] = pattern(r, m, dt)
        return "recv", pattern(self.left, m, dt)

    def check(self) -> str | None:
        """Run once on known inputs; None when every element is right, else what is wrong."""
        if self.op == "barrier":  # nothing to check but that it returns
            self.run()
            return None
        name, want = self._fill()
        self.run()
        got = self.bufs[name]
        bad = np.flatnonzero(got != want)
        if len(bad):
            i = int(bad[0])
            return f"{len(bad)} wrong elements; first at {i}: got {got[i]!r}, want {want[i]!r}"
        return None


class Backend:
    name = "?"
    rank = 0
    size = 1

    def barrier(self) -> None:
        raise NotImplementedError

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        raise NotImplementedError

    def bind(self, case: Case) -> str | None:
        """Set ``case.run``; a reason when this backend cannot run the operation."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class UnisonBackend(Backend):
    name = "unison"

    def __init__(self) -> None:
        import unison as un

        un.init()
        self.un = un
        self.rank, self.size = un.rank(), un.size()

    def barrier(self) -> None:
        self.un.barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        out = self.un.all_gather_object(obj)
        return list(out) if self.rank == 0 else None

    def bind(self, case: Case) -> str | None:
        un, b = self.un, case.bufs
        op = case.op
        if op == "all_reduce":
            case.run = lambda: un.all_reduce(b["x"])
        elif op == "broadcast":
            case.run = lambda: un.broadcast(b["x"], src=0)
        elif op == "all_gather":
            case.run = lambda: un.all_gather_into_tensor(b["out"], b["inp"])
        elif op == "reduce_scatter":
            case.run = lambda: un.reduce_scatter_tensor(b["out"], b["inp"])
        elif op == "all_gather_list":
            case.run = lambda: un.all_gather(case.blocks, b["inp"])
        elif op == "reduce_scatter_list":
            case.run = lambda: un.reduce_scatter(b["out"], case.blocks)
        elif op == "all_to_all":
            case.run = lambda: un.all_to_all_single(b["out"], b["inp"])
        elif op == "barrier":
            case.run = un.barrier
        else:
            if self.size < 2:
                return "needs two ranks"

            def sendrecv() -> None:
                w = un.irecv(b["recv"], src=case.left, tag=7)
                s = un.isend(b["send"], dst=case.right, tag=7)
                w.wait()
                s.wait()

            case.run = sendrecv
        return None

    def close(self) -> None:
        self.un.shutdown()


class GlooBackend(Backend):
    """torch.distributed over Gloo. On one host its ranks meet at ``127.0.0.1:port``;
    across hosts (``port`` 0) rank 0 serves a torch TCPStore and posts its address in
    the launcher's store, and Gloo's connections use ``unison run``'s network
    interface (``GLOO_SOCKET_IFNAME``), as unison's do."""

    name = "gloo"

    def __init__(self, port: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank = int(os.environ["UNISON_RANK"])
        self.size = int(os.environ["UNISON_SIZE"])
        if port:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank, world_size=self.size
            )
            return
        iface = os.environ.get("UNISON_NETWORK_INTERFACE", "")
        if iface:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        store = self._meet(iface)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.size)

    def _meet(self, iface: str) -> Any:
        """A torch TCPStore served by rank 0, found through the launcher's store."""
        import datetime

        from ..bootstrap import advertise_address
        from ..jobenv import detect_job
        from ..store import TCPStore

        job = detect_job(os.environ)
        assert job.store_addr is not None and job.secret is not None
        key, timeout = "bench/gloo/store", 120.0
        td = datetime.timedelta(seconds=timeout)
        dist: Any = self.dist  # torch's stubs do not export TCPStore
        with TCPStore(*job.store_addr, job.secret, timeout=timeout) as meet:
            if self.rank == 0:
                here = advertise_address(job.store_addr[0], iface)
                store = dist.TCPStore(here, 0, self.size, True, td, wait_for_workers=False)
                meet.set(key, f"{here}:{store.port}".encode())
            else:
                meet.wait([key], timeout=timeout)
                host, _, port = meet.get(key).decode().rpartition(":")
                store = dist.TCPStore(host, int(port), self.size, False, td)
            # the launcher's store lives as long as the job: no one waits for the others
        return store

    def barrier(self) -> None:
        self.dist.barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out if self.rank == 0 else None

    def bind(self, case: Case) -> str | None:
        dist = self.dist
        t = {k: self.torch.from_numpy(v) for k, v in case.bufs.items()}
        op = case.op
        if op == "all_reduce":
            case.run = lambda: dist.all_reduce(t["x"])
        elif op == "broadcast":
            case.run = lambda: dist.broadcast(t["x"], 0)
        elif op == "all_gather":
            case.run = lambda: dist.all_gather_into_tensor(t["out"], t["inp"])
        elif op == "reduce_scatter":
            case.run = lambda: dist.reduce_scatter_tensor(t["out"], t["inp"])
        elif op in ("all_gather_list", "reduce_scatter_list"):
            blocks = [self.torch.from_numpy(x) for x in case.blocks]
            if op == "all_gather_list":
                case.run = lambda: dist.all_gather(blocks, t["inp"])
            else:
                case.run = lambda: dist.reduce_scatter(t["out"], blocks)
        elif op == "all_to_all":
            case.run = lambda: dist.all_to_all_single(t["out"], t["inp"])
        elif op == "barrier":
            case.run = dist.barrier
        else:
            if self.size < 2:
                return "needs two ranks"

            def sendrecv() -> None:
                w = dist.irecv(t["recv"], src=case.left)
                s = dist.isend(t["send"], dst=case.right)
                w.wait()
                s.wait()

            case.run = sendrecv
        return None

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        out = self.comm.gather(obj, root=0)
        return list(out) if out is not None else None

    def bind(self, case: Case) -> str | None:
        c, b, MPI = self.comm, case.bufs, self.MPI
        op = case.op
        if op == "all_reduce":
            case.run = lambda: c.Allreduce(MPI.IN_PLACE, b["x"])
        elif op == "broadcast":
            case.run = lambda: c.Bcast(b["x"], root=0)
        elif op == "all_gather":
            case.run = lambda: c.Allgather(b["inp"], b["out"])
        elif op == "reduce_scatter":
            case.run = lambda: c.Reduce_scatter_block(b["inp"], b["out"])
        elif op in LIST_OPS:
            return "MPI has no list form"
        elif op == "all_to_all":
            case.run = lambda: c.Alltoall(b["inp"], b["out"])
        elif op == "barrier":
            case.run = c.Barrier
        else:
            if self.size < 2:
                return "needs two ranks"
            case.run = lambda: c.Sendrecv(
                b["send"], dest=case.right, recvbuf=b["recv"], source=case.left
            )
        return None


def make_backend(impl: str, port: int) -> Backend:
    if impl == "unison":
        return UnisonBackend()
    if impl == "gloo":
        return GlooBackend(port)
    if impl == "mpi":
        return MpiBackend()
    raise ValueError(f"unknown implementation {impl!r}")
