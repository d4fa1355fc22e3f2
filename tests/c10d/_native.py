"""unison's own API called with torch.distributed's keyword names (issue 13, section 3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import unison


def native_names() -> dict[str, Any]:
    """Every native call with a torch.distributed counterpart, by keyword, vs numpy."""
    rank, size = unison.get_rank(), unison.get_world_size()
    assert (rank, size) == (unison.rank(), unison.size())
    checks = 0
    right, left = (rank + 1) % size, (rank - 1) % size
    # send / recv / isend / irecv with tensor=, dst=, src=, tag=; recv returns the sender
    if rank == 0:
        unison.send(tensor=torch.full((3,), 7.0), dst=1, tag=5)
    elif rank == 1:
        t = torch.zeros(3)
        assert unison.recv(tensor=t, src=0, tag=5) == 0
        assert t.tolist() == [7.0] * 3, t
    s = unison.isend(tensor=torch.full((2,), float(rank)), dst=right, tag=6)
    t = torch.zeros(2)
    unison.irecv(tensor=t, src=left, tag=6).wait()
    s.wait()
    assert t.tolist() == [float(left)] * 2, t
    checks += 2
    # recv(src=None): any source, the sender returned
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            t = torch.zeros(1)
            src = unison.recv(tensor=t, src=None, tag=8)
            assert t.item() == float(src), (src, t)
            senders.add(src)
        assert senders == set(range(1, size)), senders
    else:
        unison.send(tensor=torch.tensor([float(rank)]), dst=0, tag=8)
    checks += 1
    # collectives with tensor=, op=, group=, async_op=, src=, dst=, the list names
    g = unison.new_group(ranks=list(range(size)))
    assert unison.get_rank(group=g) == rank and unison.get_world_size(group=g) == size
    t = torch.full((4,), float(rank + 1))
    w = unison.all_reduce(tensor=t, op=unison.ReduceOp.MAX, group=g, async_op=True)
    assert w is not None and w.wait()
    assert t.tolist() == [float(size)] * 4, t
    t = torch.full((4,), float(rank))
    unison.broadcast(tensor=t, src=size - 1, group=g)
    assert t.tolist() == [float(size - 1)] * 4, t
    t = torch.full((2,), float(rank + 1))
    unison.reduce(tensor=t, dst=0, op=unison.ReduceOp.SUM)
    if rank == 0:
        assert t.tolist() == [float(size * (size + 1) // 2)] * 2, t
    outs = [torch.zeros(2) for _ in range(size)]
    unison.all_gather(tensor_list=outs, tensor=torch.full((2,), float(rank)))
    assert [o[0].item() for o in outs] == [float(r) for r in range(size)], outs
    big = torch.zeros(2 * size)
    unison.all_gather_into_tensor(output_tensor=big, input_tensor=torch.full((2,), float(rank)))
    assert big.tolist() == [float(r) for r in range(size) for _ in range(2)], big
    gl = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    unison.gather(tensor=torch.tensor([float(rank)]), gather_list=gl, dst=0)
    if gl is not None:
        assert [x.item() for x in gl] == [float(r) for r in range(size)], gl
    out = torch.zeros(1)
    sl = [torch.tensor([10.0 + r]) for r in range(size)] if rank == 0 else None
    unison.scatter(tensor=out, scatter_list=sl, src=0)
    assert out.item() == 10.0 + rank, out
    out = torch.zeros(2)
    ins = [torch.full((2,), float(rank * size + j)) for j in range(size)]
    unison.reduce_scatter(output=out, input_list=ins, op=unison.ReduceOp.SUM)
    assert out.tolist() == [float(sum(r * size + rank for r in range(size)))] * 2, out
    inp = torch.arange(float(2 * size)) + rank
    out = torch.zeros(2)
    unison.reduce_scatter_tensor(output=out, input=inp, op=unison.ReduceOp.SUM)
    want = np.sum([np.arange(2.0 * size) + r for r in range(size)], 0)[2 * rank : 2 * rank + 2]
    assert np.allclose(out.numpy(), want), (out, want)
    outs = [torch.zeros(1) for _ in range(size)]
    ins = [torch.tensor([float(10 * rank + j)]) for j in range(size)]
    unison.all_to_all(output_tensor_list=outs, input_tensor_list=ins)
    assert [o.item() for o in outs] == [float(10 * j + rank) for j in range(size)], outs
    isz = [j + 1 for j in range(size)]
    inp = torch.cat([torch.full((isz[j],), float(100 * rank + j)) for j in range(size)])
    out = torch.zeros(size * (rank + 1))
    unison.all_to_all_single(
        output=out, input=inp, output_split_sizes=[rank + 1] * size, input_split_sizes=isz
    )
    want = np.concatenate([np.full(rank + 1, 100.0 * j + rank) for j in range(size)])
    assert np.array_equal(out.numpy(), want), (out, want)
    assert unison.barrier(group=g, async_op=True).wait()
    checks += 11
    # P2POp + batch_isend_irecv (a ring), broadcast_object_list
    got = torch.zeros(3, dtype=torch.int64)
    ops = [
        unison.P2POp(unison.isend, torch.full((3,), rank, dtype=torch.int64), right),
        unison.P2POp(unison.irecv, got, left),
    ]
    for w in unison.batch_isend_irecv(ops):
        w.wait()
    assert got.tolist() == [left] * 3, got
    try:
        unison.P2POp(unison.all_reduce, torch.zeros(1), 0)  # type: ignore[arg-type]
        raise AssertionError("P2POp accepted all_reduce")
    except unison.InvalidArgumentError as exc:
        assert "isend" in str(exc), exc
    objs: list[Any] = [{"from": rank}, rank] if rank == 1 else [None, None]
    unison.broadcast_object_list(object_list=objs, src=1)
    assert objs == [{"from": 1}, 1], objs
    checks += 3
    return {"checks": checks}
