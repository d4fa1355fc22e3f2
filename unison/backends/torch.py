"""The ``torch`` backend: every operation on torch.distributed (Gloo for CPU, NCCL for CUDA).

unison adopts an existing default process group (a script that already called
``init_process_group``) or creates one: from torchrun's variables when they are set,
otherwise through unison's own rendezvous (``unison run``, ``unison.testing.spawn``):
rank 0 opens a torch TCPStore on a free port and publishes it in unison's store.
numpy arrays become tensors with ``torch.from_numpy`` (no copy). Every call is
issued with ``async_op=True`` and waited on within the job's timeout.

Gloo has no AVG: it is SUM then a division, on every process group. What the
process group cannot do raises :class:`UnsupportedError` naming the backend.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._types import ReduceOp
from ..bootstrap import host_identity
from ..buffers import Buffer, DType, finalize_average, is_torch_tensor
from ..comm.group import ANY_SOURCE
from ..comm.work import Work
from ..errors import CommunicationError, MismatchError, PeerLostError, UnsupportedError
from .base import BackendRuntime, check_launch, comm_error, pack, poll_work, raw, unpack

if TYPE_CHECKING:
    from ..comm.group import Group
    from ..config import Config

__all__ = ["TorchBackend", "open_runtime"]

_PORT_KEY = "unison/torch/port"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed and not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _unsupported(e: BaseException) -> bool:
    text = str(e).lower()
    return any(
        k in text for k in ("not supported", "unsupported", "not implemented", "invalid scalar")
    )


class TorchBackend:
    name = "torch"
    #: broadcast/all_reduce/reduce take CUDA tensors as they are (NCCL, no host staging)
    accepts_device_buffers = True
    checks_signatures = False

    def __init__(self, config: Config) -> None:
        import torch
        import torch.distributed as dist

        self.torch: Any = torch
        self.dist: Any = dist
        self.timeout = config.timeout
        self.owned = False
        self.groups: dict[int, Any] = {}
        self.procs: dict[int, tuple[int, str]] = {}  # rank -> (pid, host identity)
        r = dist.ReduceOp
        self._ops = {
            ReduceOp.SUM: r.SUM,
            ReduceOp.AVG: r.SUM,
            ReduceOp.PRODUCT: r.PRODUCT,
            ReduceOp.MIN: r.MIN,
            ReduceOp.MAX: r.MAX,
            ReduceOp.BAND: r.BAND,
            ReduceOp.BOR: r.BOR,
            ReduceOp.BXOR: r.BXOR,
        }

    # --- process group ---------------------------------------------------------------------
    def start(self, config: Config) -> tuple[int, int]:
        dist, torch = self.dist, self.torch
        if not dist.is_available():
            raise UnsupportedError("this torch build has no torch.distributed")
        if not dist.is_initialized():
            pg = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            td = datetime.timedelta(seconds=config.timeout)
            if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
                dist.init_process_group(pg, timeout=td)
            else:
                store, rank, size = self._rendezvous(config)
                dist.init_process_group(pg, store=store, rank=rank, world_size=size, timeout=td)
            self.owned = True
            if not torch.cuda.is_available() and dist.get_world_size() > 1:
                # where each rank runs, to name a lost one (Gloo's error names an address)
                procs: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(procs, (os.getpid(), host_identity()))
                self.procs = {r: (int(p[0]), str(p[1])) for r, p in enumerate(procs)}
        self.groups[0] = dist.group.WORLD
        return int(dist.get_rank()), int(dist.get_world_size())

    def _rendezvous(self, config: Config) -> tuple[Any, int, int]:
        """A torch TCPStore found through unison's store (``unison run``, spawn)."""
        from ..jobenv import detect_job
        from ..store import FileStore, Store, TCPStore, TCPStoreServer

        job = detect_job(os.environ)
        if job.size == 1:
            return self.dist.HashStore(), 0, 1
        server = None
        ustore: Store
        if job.store_addr is not None:
            host, port = job.store_addr
            if job.host_store:
                server = TCPStoreServer("0.0.0.0", port, job.secret).start()
            ustore = TCPStore(host, port, job.secret, timeout=config.timeout)
        elif job.store_path:
            host = "127.0.0.1"
            ustore = FileStore(job.store_path, timeout=config.timeout)
        else:
            raise UnsupportedError(
                f"rank {job.rank} of {job.size}: the torch backend found no rendezvous; start "
                "the job with `unison run`, torchrun, or set MASTER_ADDR and MASTER_PORT"
            )
        td = datetime.timedelta(seconds=config.timeout)
        try:
            if job.rank == 0:
                tstore = self.dist.TCPStore(host, 0, job.size, True, td, wait_for_workers=False)
                ustore.set(_PORT_KEY, str(tstore.port).encode())
            else:
                ustore.wait([_PORT_KEY], timeout=config.timeout)
                port = int(ustore.get(_PORT_KEY).decode())
                tstore = self.dist.TCPStore(host, port, job.size, False, td)
            # every rank must have read the port before rank 0's unison store goes away
            done = ustore.add("unison/torch/joined", 1)
            if done < job.size:
                ustore.wait(["unison/torch/all"], timeout=config.timeout)
            else:
                ustore.set("unison/torch/all", b"1")
        finally:
            ustore.close()
        self._server = server
        return tstore, job.rank, job.size

    def _g(self, comm: Group) -> Any:
        return self.groups[comm.id]

    def _t(self, arr: np.ndarray, dtype: DType) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only inputs: torch only reads them
            t = self.torch.from_numpy(arr)
        return t.view(self.torch.bfloat16) if dtype is DType.BFLOAT16 else t

    def _buf(self, b: Buffer) -> Any:
        src = b.source
        if is_torch_tensor(src) and src.device.type != "cpu":
            return src.view(-1)  # NCCL: the device tensor itself
        return self._t(b.array, b.dtype)

    def _raw(self, b: Buffer) -> Any:
        """Bytes for data movement (Gloo moves any dtype that way)."""
        src = b.source
        if is_torch_tensor(src) and src.device.type != "cpu":
            return src.view(-1)
        return self._t(raw(b.array), DType.UINT8)

    def _wide(self, t: Any) -> Any:
        """Gloo cannot reduce int16: reduce in int32 (exact, wrapping as int16 does)."""
        if t.dtype == self.torch.int16 and not t.is_cuda:
            return t.to(self.torch.int32)
        return t

    def _op(self, op: ReduceOp, b: Buffer) -> Any:
        if b.dtype is DType.BOOL and op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVG):
            raise UnsupportedError(f"the torch backend cannot reduce bool with {op.name}")
        return self._ops[op]

    def _run(
        self,
        comm: Group,
        what: str,
        start: Callable[[], list[Any]],
        done: Callable[[], Any] | None = None,
        p2p: bool = False,
        source: Callable[[], int] | None = None,
    ) -> Work:
        name = what if p2p else f"{what} (group {comm.id}, torch)"
        try:
            works = [w for w in start() if w is not None]
        except Exception as exc:
            raise self._error(name, exc) from exc
        if p2p:
            # Gloo's send/recv works report completion only from wait(): a helper thread
            # waits (bounded by the process group's own timeout) and poll_work watches it.
            flag = threading.Event()
            errors: list[BaseException] = []

            def waiter() -> None:
                try:
                    for w in works:
                        w.wait()
                except BaseException as exc:
                    errors.append(exc)
                flag.set()

            threading.Thread(target=waiter, name="unison-torch-p2p", daemon=True).start()

            def p2p_test() -> bool:
                if not flag.is_set():
                    return False
                if errors:
                    raise errors[0]
                return True

            return poll_work(
                name,
                p2p_test,
                comm.config.timeout,
                lambda e: self._error(name, e),
                done,
                source=source,
            )

        def test() -> bool:
            if not all(w.is_completed() for w in works):
                return False
            for w in works:
                w.wait()  # raises the engine's error
            return True

        def block() -> None:
            for w in works:
                w.wait()  # bounded by the process group's timeout (the job's)

        return poll_work(
            name,
            test,
            comm.config.timeout,
            lambda e: self._error(name, e),
            done,
            block,
            on_error=comm.mark_broken,
        )

    def _error(self, name: str, exc: BaseException) -> BaseException:
        if _unsupported(exc):
            return UnsupportedError(f"{name}: the torch backend cannot do this: {exc}")
        err = comm_error("torch", name, exc)
        lost = self._lost_ranks() if type(err) is CommunicationError else []
        if lost:  # Gloo says which address closed; name the rank whose process ended
            who = ", ".join(map(str, lost))
            return PeerLostError(
                f"{name}: rank{'s' if len(lost) > 1 else ''} {who} "
                f"{'were' if len(lost) > 1 else 'was'} lost (the process ended); {err}",
                op=name,
                ranks=tuple(lost),
            )
        return err

    def _lost_ranks(self, settle: float = 1.0) -> list[int]:
        """Ranks on this host whose process is gone (those elsewhere cannot be seen).

        A killed process closes its sockets before it is a zombie: Gloo may report the
        closed connection first, so a process ending is awaited up to ``settle`` s."""
        here, me = host_identity(), os.getpid()
        local = [(r, pid) for r, (pid, where) in sorted(self.procs.items()) if where == here]
        end = time.monotonic() + settle
        while True:
            lost = [r for r, pid in local if pid != me and not _running(pid)]
            if lost or not local or time.monotonic() >= end:
                return lost
            time.sleep(0.02)

    # --- collectives -----------------------------------------------------------------------
    def broadcast(self, comm: Group, b: Buffer, root: int) -> Work:
        t, g, src = self._raw(b), self._g(comm), comm.ranks[root]
        return self._run(comm, "broadcast", lambda: [self.dist.broadcast(t, src, g, async_op=True)])

    def _avg(self, comm: Group, b: Buffer, op: ReduceOp, t: Any) -> Callable[[], Any]:
        def done() -> None:
            if op is ReduceOp.AVG:
                if b.array.size == b.count and not (is_torch_tensor(b.source) and t.is_cuda):
                    finalize_average(b.array, b.dtype, comm.size)
                elif t.is_floating_point():
                    t.div_(comm.size)
                else:
                    t.copy_(self.torch.div(t, comm.size, rounding_mode="trunc"))

        return done

    def all_reduce(self, comm: Group, b: Buffer, op: ReduceOp) -> Work:
        t, g, rop = self._buf(b), self._g(comm), self._op(op, b)
        w = self._wide(t)
        avg = self._avg(comm, b, op, t)

        def done() -> None:
            if w is not t:
                t.copy_(w)
            avg()

        return self._run(
            comm,
            "all_reduce",
            lambda: [self.dist.all_reduce(w, rop, g, async_op=True)],
            done,
        )

    def all_reduce_pieces(self, *args: Any) -> None:
        """None: the caller packs the arrays into one buffer (torch reduces one buffer)."""
        return None

    def reduce(self, comm: Group, b: Buffer, root: int, op: ReduceOp) -> Work:
        g, rop, dst = self._g(comm), self._op(op, b), comm.ranks[root]
        mine = comm.rank == root
        t = self._buf(b)
        w = self._wide(t) if mine else self._wide(t).clone()  # non-roots' buffers stay intact
        avg = self._avg(comm, b, op, t)

        def done() -> None:
            if mine:
                if w is not t:
                    t.copy_(w)
                avg()

        return self._run(
            comm,
            "reduce",
            lambda: [self.dist.reduce(w, dst, rop, g, async_op=True)],
            done,
        )

    def all_gather(self, comm: Group, b: Buffer, outs: list[np.ndarray], result: Any) -> Work:
        g, t = self._g(comm), self._raw(b)
        ts = [self._t(raw(o), DType.UINT8) for o in outs]
        return self._run(
            comm,
            "all_gather",
            lambda: [self.dist.all_gather(ts, t, g, async_op=True)],
            lambda: result,
        )

    def gather(
        self,
        comm: Group,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        g, t, dst = self._g(comm), self._raw(b), comm.ranks[root]
        ts = None if outs is None else [self._t(raw(o), DType.UINT8) for o in outs]
        return self._run(comm, "gather", lambda: [self.dist.gather(t, ts, dst, g, async_op=True)])

    def scatter(
        self,
        comm: Group,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        g, t, src = self._g(comm), self._raw(b), comm.ranks[root]
        ts = None if ins is None else [self._t(raw(i), DType.UINT8) for i in ins]
        return self._run(comm, "scatter", lambda: [self.dist.scatter(t, ts, src, g, async_op=True)])

    def reduce_scatter(
        self,
        comm: Group,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
    ) -> Work:
        # Gloo has no reduce_scatter: all-reduce the concatenation, keep this rank's block.
        g, rop = self._g(comm), self._op(op, out)
        whole = self._wide(self._t(np.concatenate(ins) if ins else out.array[:0].copy(), out.dtype))
        me, n = comm.rank or 0, out.count
        t = self._buf(out)

        def done() -> None:
            t.copy_(whole[me * n : (me + 1) * n])
            self._avg(comm, out, op, t)()

        return self._run(
            comm,
            "reduce_scatter",
            lambda: [self.dist.all_reduce(whole, rop, g, async_op=True)],
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
        # one all_to_all_single on bytes serves lists and uneven splits alike
        g = self._g(comm)
        send = self.torch.from_numpy(pack(ins))
        rsz = [int(x.nbytes) for x in outs]
        recv = self.torch.empty(sum(rsz), dtype=self.torch.uint8)
        ssz = [int(x.nbytes) for x in ins]

        def done() -> Any:
            unpack(recv.numpy(), outs)
            return result

        return self._run(
            comm,
            "all_to_all",
            lambda: [self.dist.all_to_all_single(recv, send, rsz, ssz, g, async_op=True)],
            done,
        )

    def barrier(self, comm: Group) -> Work:
        g = self._g(comm)
        return self._run(comm, "barrier", lambda: [self.dist.barrier(g, async_op=True)])

    # --- point-to-point ----------------------------------------------------------------------
    def isend(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        t = self._t(raw(b.array), DType.UINT8)
        name = f"send to rank {peer} (tag {tag}, torch)"
        return self._run(
            comm, name, lambda: [self.dist.isend(t, peer, self._g(comm), tag)], p2p=True
        )

    def irecv(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        t = self._t(raw(b.array), DType.UINT8)
        anyone = peer == ANY_SOURCE
        name = f"recv from {'any rank' if anyone else f'rank {peer}'} (tag {tag}, torch)"
        posted: list[Any] = []

        def start() -> list[Any]:
            # src=None: torch's receive from any rank of the group (recv_anysource)
            posted.append(self.dist.irecv(t, None if anyone else peer, self._g(comm), tag))
            return posted

        def sender() -> int:
            """The sender's global rank (torch's work names its rank in the group)."""
            return int(comm.ranks[posted[0]._source_rank()]) if anyone else peer

        try:
            w = self._run(comm, name, start, lambda: b.source, p2p=True, source=sender)
        except Exception as exc:
            raise MismatchError(f"{name}: {exc}", op=name, ranks=() if anyone else (peer,)) from exc
        return w

    # --- groups ----------------------------------------------------------------------------------
    def new_group(self, gid: int, ranks: Sequence[int], timeout: float) -> None:
        # the group's timeout (by default the job's): torch's default is far longer
        td = datetime.timedelta(seconds=timeout)
        self.groups[gid] = self.dist.new_group(list(ranks), timeout=td)

    def close(self) -> None:
        self.groups.clear()
        if self.owned and self.dist.is_initialized():
            try:
                self.dist.destroy_process_group()
            except Exception:
                pass
        server = getattr(self, "_server", None)
        if server is not None:
            server.close()


def open_runtime(config: Config) -> BackendRuntime:
    import socket

    be = TorchBackend(config)
    rank, size = be.start(config)
    try:
        check_launch("torch", rank, size)
    except BaseException:
        be.close()
        raise
    names: list[Any] = [None] * size
    be.dist.all_gather_object(names, socket.gethostname())
    hosts = list(dict.fromkeys(names))
    local = [r for r in range(size) if names[r] == names[rank]]
    layout = (local.index(rank), len(local), hosts.index(names[rank]), len(hosts))
    return BackendRuntime(be, config, rank, size, layout)
