"""Rank bodies of the c10d tests: each one launched job runs many checks.

Every data the ranks compute is a deterministic function of (rank, call), so each
rank computes the numpy oracle for all ranks locally and compares.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import unison
import unison.torch.distributed as udist
from unison.testing.oracle import reduce_oracle

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16]
_U = {
    "SUM": unison.ReduceOp.SUM,
    "PRODUCT": unison.ReduceOp.PRODUCT,
    "MIN": unison.ReduceOp.MIN,
    "MAX": unison.ReduceOp.MAX,
    "AVG": unison.ReduceOp.AVG,
    "BAND": unison.ReduceOp.BAND,
    "BOR": unison.ReduceOp.BOR,
    "BXOR": unison.ReduceOp.BXOR,
}


def init(backend: str = "unison", timeout: float = 60.0) -> tuple[int, int]:
    rank = int(os.environ["UNISON_RANK"])
    size = int(os.environ["UNISON_SIZE"])
    dist.init_process_group(
        backend,
        init_method=os.environ["C10D_INIT"],
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout),
    )
    return rank, size


def data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    g = np.random.default_rng(1000 * salt + rank)
    if dtype.is_floating_point:
        return torch.from_numpy(g.uniform(-2, 2, n).astype(np.float64)).to(dtype)
    return torch.from_numpy(g.integers(1, 7, n).astype(np.int64)).to(dtype)


def close(a: torch.Tensor, b: Any, what: str) -> None:
    b = np.asarray(b)
    tol = 2e-2 if a.dtype == torch.float16 else 1e-5
    if not np.allclose(a.double().numpy(), b.astype(np.float64), rtol=tol, atol=tol):
        raise AssertionError(f"{what}: got {a.numpy()[:8]} want {b[:8]}")


def collectives() -> dict[str, int]:
    """Every collective torch.distributed has, blocking and async, against numpy."""
    rank, size = init()
    assert dist.get_backend() == "unison"
    checks = 0
    n = 13
    # all_reduce: every op, every dtype, blocking and async
    for dtype in DTYPES:
        ops = ["SUM", "MIN", "MAX", "AVG", "PRODUCT"]
        if not dtype.is_floating_point:
            ops += ["BAND", "BOR", "BXOR"]
        for i, name in enumerate(ops):
            if name == "AVG" and not dtype.is_floating_point:
                continue
            t = data(rank, n, dtype, i)
            want = reduce_oracle([data(r, n, dtype, i).numpy() for r in range(size)], _U[name])
            if i % 2:
                w = dist.all_reduce(t, op=getattr(dist.ReduceOp, name), async_op=True)
                w.wait()
                assert w.is_completed() and w.exception() is None
            else:
                dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            close(t, want, f"all_reduce {name} {dtype}")
            checks += 1
    # PREMUL_SUM: a clear error
    try:
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
    except (NotImplementedError, RuntimeError, ValueError) as exc:
        assert "PREMUL_SUM" in str(exc) or "unison" in str(exc), exc
        checks += 1
    # a contiguous CPU tensor reaches unison itself, blocking and async: no staging copy
    from unison.comm import collectives as uc

    handed: list[Any] = []
    real = uc.all_reduce

    def spy(comm: Any, buf: Any, op: Any, async_op: bool) -> Any:
        handed.append(buf)
        return real(comm, buf, op, async_op)

    uc.all_reduce = spy
    try:
        t = torch.full((1 << 16,), float(rank + 1))
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
    finally:
        uc.all_reduce = real
    assert len(handed) == 2 and all(b is t for b in handed), handed
    assert t[0].item() == t[-1].item() == float(size * size * (size + 1) // 2), t
    checks += 1
    # non-contiguous and bfloat16 tensors go through a staged copy
    t = data(rank, 12, torch.float32).reshape(3, 4).t()
    want = sum(data(r, 12, torch.float32).reshape(3, 4).t().numpy() for r in range(size))
    dist.all_reduce(t)
    close(t, want, "all_reduce non-contiguous")
    b = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(b)
    assert b.float().tolist() == [float(size * (size + 1) // 2)] * 5, b
    checks += 2
    # all_reduce_coalesced (torch's deprecated API still in 2.13)
    ts = [data(rank, 3, torch.float32, 1), data(rank, 5, torch.float32, 2)]
    if hasattr(dist, "all_reduce_coalesced"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_reduce_coalesced(ts)
        close(ts[0], sum(data(r, 3, torch.float32, 1).numpy() for r in range(size)), "coalesced")
        close(ts[1], sum(data(r, 5, torch.float32, 2).numpy() for r in range(size)), "coalesced")
        checks += 1
    # reduce / broadcast at every root
    for root in range(size):
        t = data(rank, n, torch.float64, root)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            close(
                t,
                np.max([data(r, n, torch.float64, root).numpy() for r in range(size)], 0),
                "reduce",
            )
        t = data(rank, n, torch.int32, root)
        w = dist.broadcast(t, src=root, async_op=True)
        assert w.wait()
        close(t, data(root, n, torch.int32, root).numpy(), "broadcast")
        checks += 2
    # all_gather, all_gather_into_tensor, gather, scatter
    mine = data(rank, n, torch.float32)
    outs = [torch.empty(n) for _ in range(size)]
    dist.all_gather(outs, mine)
    for r in range(size):
        close(outs[r], data(r, n, torch.float32).numpy(), "all_gather")
    big = torch.empty(size * n)
    dist.all_gather_into_tensor(big, mine)
    close(big, np.concatenate([data(r, n, torch.float32).numpy() for r in range(size)]), "agit")
    glist = [torch.empty(n) for _ in range(size)] if rank == size - 1 else None
    dist.gather(mine, gather_list=glist, dst=size - 1)
    if glist is not None:
        for r in range(size):
            close(glist[r], data(r, n, torch.float32).numpy(), "gather")
    out = torch.empty(n, dtype=torch.int64)
    slist = [data(100 + r, n, torch.int64) for r in range(size)] if rank == 0 else None
    dist.scatter(out, scatter_list=slist, src=0)
    close(out, data(100 + rank, n, torch.int64).numpy(), "scatter")
    checks += 4
    # all_gather_coalesced (deprecated in 2.13, still there); torch's coalescing manager,
    # which hands the group all_reduce_coalesced, all_gather_single_coalesced and
    # reduce_scatter_single_coalesced
    if hasattr(dist, "all_gather_coalesced"):
        import warnings

        ins_c = [data(rank, 3, torch.float64, 5), data(rank, 2, torch.float64, 6)]
        outs_c = [
            [torch.empty(3, dtype=torch.float64), torch.empty(2, dtype=torch.float64)]
            for _ in range(size)
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_gather_coalesced(outs_c, ins_c)
        for r in range(size):
            close(outs_c[r][0], data(r, 3, torch.float64, 5).numpy(), "all_gather_coalesced")
            close(outs_c[r][1], data(r, 2, torch.float64, 6).numpy(), "all_gather_coalesced")
        checks += 1
    a, b = data(rank, 4, torch.float32, 7), data(rank, 6, torch.float32, 8)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    close(a, sum(data(r, 4, torch.float32, 7).numpy() for r in range(size)), "coalesced ar")
    close(b, sum(data(r, 6, torch.float32, 8).numpy() for r in range(size)), "coalesced ar")
    bigs = [torch.empty(size * 2), torch.empty(size * 3)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(bigs[0], data(rank, 2, torch.float32, 9))
        dist.all_gather_into_tensor(bigs[1], data(rank, 3, torch.float32, 10))
    for k, (m, salt) in enumerate(((2, 9), (3, 10))):
        want_g = np.concatenate([data(r, m, torch.float32, salt).numpy() for r in range(size)])
        close(bigs[k], want_g, "coalesced all_gather_into_tensor")
    rs = [torch.empty(2), torch.empty(3)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rs[0], data(rank, 2 * size, torch.float32, 11))
        dist.reduce_scatter_tensor(rs[1], data(rank, 3 * size, torch.float32, 12))
    for k, (m, salt) in enumerate(((2, 11), (3, 12))):
        tot = sum(data(r, m * size, torch.float32, salt).numpy() for r in range(size))
        close(rs[k], tot[rank * m : (rank + 1) * m], "coalesced reduce_scatter_tensor")
    checks += 3
    # reduce_scatter, reduce_scatter_tensor
    ins = [data(rank, n, torch.float32, j) for j in range(size)]
    out = torch.empty(n)
    dist.reduce_scatter(out, ins)
    close(out, sum(data(r, n, torch.float32, rank).numpy() for r in range(size)), "reduce_scatter")
    inp = data(rank, size * n, torch.float64)
    out = torch.empty(n, dtype=torch.float64)
    w = dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG, async_op=True)
    w.wait(timeout=timedelta(seconds=30))
    want = np.mean([data(r, size * n, torch.float64).numpy() for r in range(size)], 0)
    close(out, want[rank * n : (rank + 1) * n], "reduce_scatter_tensor AVG")
    checks += 2
    # all_to_all, all_to_all_single (even and uneven splits)
    ins = [torch.full((2,), float(10 * rank + j)) for j in range(size)]
    outs = [torch.empty(2) for _ in range(size)]
    dist.all_to_all(outs, ins)
    for j in range(size):
        assert outs[j].tolist() == [float(10 * j + rank)] * 2, outs
    isplit = [r + 1 for r in range(size)]  # rank sends r+1 elements to rank r
    inp = torch.cat([torch.full((isplit[j],), float(100 * rank + j)) for j in range(size)])
    osplit = [rank + 1] * size
    out = torch.empty(sum(osplit))
    dist.all_to_all_single(out, inp, output_split_sizes=osplit, input_split_sizes=isplit)
    want = np.concatenate([np.full(rank + 1, 100.0 * j + rank) for j in range(size)])
    close(out, want, "all_to_all_single uneven")
    checks += 2
    # barrier, object collectives (torch builds them on the tensor ones)
    dist.barrier()
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(size)], objs
    lst = [f"hello {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    assert lst == ["hello 1", 1], lst
    got: list[Any] = [None]
    dist.scatter_object_list(got, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
    assert got == [f"to {rank}"], got
    gl = [None] * size if rank == 0 else None
    dist.gather_object(("g", rank), gl, dst=0)
    if rank == 0:
        assert gl == [("g", r) for r in range(size)], gl
    checks += 5
    # send/recv/isend/irecv, batch_isend_irecv (ring), tags
    right, left = (rank + 1) % size, (rank - 1) % size
    if size > 1:
        if rank % 2 == 0:
            dist.send(torch.full((4,), float(rank)), dst=right, tag=7)
            t = torch.empty(4)
            dist.recv(t, src=left, tag=7)
        else:
            t = torch.empty(4)
            dist.recv(t, src=left, tag=7)
            dist.send(torch.full((4,), float(rank)), dst=right, tag=7)
        assert t.tolist() == [float(left)] * 4, t
        got_t = torch.empty(3, dtype=torch.int64)
        ops = [
            dist.P2POp(dist.isend, torch.full((3,), rank, dtype=torch.int64), right),
            dist.P2POp(dist.irecv, got_t, left),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert got_t.tolist() == [left] * 3, got_t
        s = dist.isend(torch.arange(5.0) + rank, dst=right)
        r_t = torch.empty(5)
        rw = dist.irecv(r_t, src=left)
        s.wait()
        rw.wait()
        assert r_t.tolist() == (torch.arange(5.0) + left).tolist(), r_t
        checks += 3
    # recv(src=None): any source; per sender in send order; the source is returned
    if size > 1:
        if rank == 0:
            seen: dict[int, list[float]] = {}
            for _ in range(2 * (size - 1)):
                t = torch.empty(2)
                src = dist.recv(t, tag=11)
                assert t[0].item() == float(src), (src, t)
                seen.setdefault(src, []).append(t[1].item())
            assert seen == {r: [0.0, 1.0] for r in range(1, size)}, seen
            t = torch.empty(2)
            w = dist.irecv(t, tag=12)  # posted before anything is sent
            dist.barrier()
            w.wait()
            assert t[0].item() == float(size - 1) and w._source_rank() == size - 1, t
        else:
            for k in range(2):
                dist.send(torch.tensor([float(rank), float(k)]), dst=0, tag=11)
            dist.barrier()
            if rank == size - 1:
                dist.send(torch.tensor([float(rank), 0.0]), dst=0, tag=12)
        checks += 2
    # futures: get_future completes without wait; then() chains
    t = torch.ones(8)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.then(lambda f: f.value()[0] * 2).wait()
    assert res.tolist() == [2.0 * size] * 8, res
    # the group's engine completes a collective's future: no waiter thread per future
    assert not [x for x in threading.enumerate() if x.name == "unison-c10d-future"]
    checks += 1
    # sub-groups: new_group over even ranks, new_subgroups of 2
    evens = list(range(0, size, 2))
    g = dist.new_group(evens)
    if rank in evens:
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=g)
        assert t.tolist() == [float(sum(evens))] * 3, t
        t = torch.full((2,), float(rank))
        dist.broadcast(t, src=evens[-1], group=g)
        assert t.tolist() == [float(evens[-1])] * 2
        checks += 2
    if size % 2 == 0:
        sub, _subs = dist.new_subgroups(2)
        t = torch.full((1,), float(rank))
        dist.all_reduce(t, group=sub)
        base = rank - rank % 2
        assert t.item() == float(base + base + 1), t
        checks += 1
    # monitored_barrier: torch's own refuses non-Gloo; unison's has its semantics
    udist.monitored_barrier(timeout=timedelta(seconds=30))
    checks += 1
    dist.barrier()
    dist.destroy_process_group()
    return {"checks": checks}
