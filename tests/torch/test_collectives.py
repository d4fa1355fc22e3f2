"""Every collective in every form Horovod has, on real ranks, against a numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest

from ._util import hvd_spawn

pytestmark = pytest.mark.timeout(120)

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def _data(rank: int, dtype: str, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    rng = np.random.default_rng(100 + rank)
    lo, hi = (0, 9) if dtype in ("uint8", "int8") else (-50, 50)
    if dtype == "uint8":
        lo = 0
    return rng.integers(lo, hi, size=shape).astype(dtype)


def _allreduce_all_forms() -> None:
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    for dt in DTYPES:
        every = [_data(k, dt) for k in range(n)]
        want_sum = np.sum(np.stack(every).astype(np.float64), 0)
        t = torch.from_numpy(every[r].copy())
        before = t.clone()
        s = hvd.allreduce(t, op=hvd.Sum, name=f"s.{dt}")
        assert torch.equal(t, before), "allreduce must not modify its input"
        np.testing.assert_allclose(s.double().numpy(), want_sum, rtol=1e-3)
        assert s.dtype == t.dtype
        mx = hvd.allreduce(t, op=hvd.Max, name=f"max.{dt}")
        np.testing.assert_array_equal(mx.numpy(), np.max(np.stack(every), 0))
        mn = hvd.allreduce(t, op=hvd.Min, name=f"min.{dt}")
        np.testing.assert_array_equal(mn.numpy(), np.min(np.stack(every), 0))
        h = hvd.allreduce_async_(t, op=hvd.Sum, name=f"ip.{dt}")
        assert hvd.synchronize(h) is t
        np.testing.assert_allclose(t.double().numpy(), want_sum, rtol=1e-3)
    # Average (default) and Product on floats; the deprecated average=
    x = torch.tensor([1.0, 2.0, 3.0]) * (r + 1)
    avg = hvd.allreduce(x)
    np.testing.assert_allclose(avg.numpy(), np.array([1.0, 2, 3]) * (n + 1) / 2)
    with pytest.warns(DeprecationWarning):
        s = hvd.allreduce(x, average=False, name="dep")
    np.testing.assert_allclose(s.numpy(), np.array([1.0, 2, 3]) * n * (n + 1) / 2)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    p = hvd.allreduce(torch.full((2,), float(r + 2)), op=hvd.Product, name="prod")
    assert p.tolist() == [float(np.prod([k + 2 for k in range(n)]))] * 2
    # prescale multiplies every input, postscale the result; Average divides after that
    y = hvd.allreduce(torch.ones(4), op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
    np.testing.assert_allclose(y.numpy(), np.full(4, 1.5))
    z = hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    np.testing.assert_allclose(z.numpy(), np.full(4, 2.0 * n * 0.25))
    zi = hvd.allreduce(torch.full((3,), 5, dtype=torch.int32), op=hvd.Average, name="iavg")
    assert zi.tolist() == [5, 5, 5] and zi.dtype == torch.int32
    # fp16 compression: travels as half, comes back as float32
    c = hvd.allreduce(torch.full((5,), 0.5), compression=hvd.Compression.fp16, op=hvd.Sum)
    assert c.dtype == torch.float32 and c.tolist() == [0.5 * n] * 5
    # grouped forms
    g = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3, 2) * r], op=hvd.Sum)
    assert [t.tolist() for t in g] == [[n * (n - 1) / 2] * 2, [[n * (n - 1) / 2] * 2] * 3]
    ts = [torch.ones(2) * r, torch.ones(1) * r]
    hvd.synchronize(hvd.grouped_allreduce_async_(ts, op=hvd.Sum))
    assert ts[0].tolist() == [n * (n - 1) / 2] * 2
    hvd.grouped_allreduce_(ts, op=hvd.Max)
    out = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(1)], op=hvd.Sum))
    assert out[0].tolist() == [float(n)]
    # Adasum of identical vectors is that vector; of orthogonal ones, their sum
    same = hvd.allreduce(torch.tensor([3.0, 4.0]), op=hvd.Adasum, name="ada1")
    np.testing.assert_allclose(same.numpy(), [3.0, 4.0], rtol=1e-6)
    e = torch.zeros(n)
    e[r] = 1.0
    orth = hvd.allreduce(e, op=hvd.Adasum, name="ada2")
    np.testing.assert_allclose(orth.numpy(), np.ones(n), rtol=1e-6)
    # bfloat16 moves too
    bf = hvd.allreduce(torch.ones(3, dtype=torch.bfloat16), op=hvd.Sum)
    assert bf.dtype == torch.bfloat16 and bf.float().tolist() == [float(n)] * 3


def test_allreduce_every_form_op_and_dtype() -> None:
    hvd_spawn(_allreduce_all_forms, 2)


def _gather_bcast_alltoall_rs() -> None:
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    for dt in DTYPES:
        mine = _data(r, dt, (r + 1, 2))
        g = hvd.allgather(torch.from_numpy(mine), name=f"g.{dt}")
        want = np.concatenate([_data(k, dt, (k + 1, 2)) for k in range(n)])
        np.testing.assert_array_equal(g.numpy(), want)
        b = torch.from_numpy(_data(r, dt))
        out = hvd.broadcast(b, root_rank=n - 1, name=f"b.{dt}")
        np.testing.assert_array_equal(out.numpy(), _data(n - 1, dt))
        assert not torch.equal(b, out) or r == n - 1
        hvd.broadcast_(b, root_rank=0, name=f"bi.{dt}")
        np.testing.assert_array_equal(b.numpy(), _data(0, dt))
    # grouped allgather, async forms
    gg = hvd.grouped_allgather([torch.full((1,), r), torch.full((r + 1, 3), r)])
    assert gg[0].tolist() == list(range(n)) and gg[1].shape == (n * (n + 1) // 2, 3)
    h = hvd.allgather_async(torch.tensor([r]))
    assert hvd.synchronize(h).tolist() == list(range(n))
    h = hvd.broadcast_async(torch.tensor([r]), 1)
    assert hvd.synchronize(h).tolist() == [1]
    t = torch.tensor([r])
    hvd.synchronize(hvd.broadcast_async_(t, 0))
    assert t.tolist() == [0]
    # alltoall with splits: rank r sends j+1 rows of value 10r+j to rank j
    splits = [j + 1 for j in range(n)]
    rows = torch.cat([torch.full((j + 1, 2), 10 * r + j) for j in range(n)])
    out, received = hvd.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    want = torch.cat([torch.full((r + 1, 2), 10 * k + r) for k in range(n)])
    assert torch.equal(out, want)
    even = hvd.alltoall(torch.arange(n * 2) + 100 * r)
    assert isinstance(even, torch.Tensor)
    assert even.tolist() == [x for k in range(n) for x in (100 * k + 2 * r, 100 * k + 2 * r + 1)]
    o2, rs2 = hvd.synchronize(hvd.alltoall_async(rows, splits=torch.tensor(splits)))
    assert torch.equal(o2, want) and rs2.tolist() == [r + 1] * n
    with pytest.raises(ValueError, match="splits"):  # more rows than the tensor has
        hvd.alltoall(rows, splits=[len(rows)] * n)
    # reducescatter: lower ranks get the extra rows
    x = torch.arange(5 * 2, dtype=torch.float32).reshape(5, 2) * (r + 1)
    rs = hvd.reducescatter(x, op=hvd.Sum)
    full = torch.arange(10, dtype=torch.float32).reshape(5, 2) * (n * (n + 1) / 2)
    parts = torch.split(full, [2, 2, 1][:n] if n == 3 else [3, 2], dim=0)
    assert torch.equal(rs, parts[r])
    avg = hvd.reducescatter(x, name="rsavg")
    assert torch.allclose(avg, parts[r] / n)
    grs = hvd.grouped_reducescatter([torch.ones(n, 1) * r, torch.ones(2 * n, 2)], op=hvd.Sum)
    assert grs[0].tolist() == [[n * (n - 1) / 2]] and grs[1].shape == (2, 2)
    h = hvd.reducescatter_async(torch.ones(n), op=hvd.Sum, prescale_factor=2.0)
    assert hvd.synchronize(h).tolist() == [2.0 * n]
    hvd.barrier()
    # objects
    assert hvd.broadcast_object({"r": r, "t": torch.ones(2) * r}, root_rank=1)["r"] == 1
    assert hvd.allgather_object(("x", r)) == [("x", k) for k in range(n)]


@pytest.mark.parametrize("np_", [2, 3])
def test_allgather_broadcast_alltoall_reducescatter(np_: int) -> None:
    hvd_spawn(_gather_bcast_alltoall_rs, np_)


def _gradients() -> None:
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    # d/dx of sum(allreduce_sum(x_r)) over the job: allreduce(grad) of ones -> n per element
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert x.grad.tolist() == [float(n)] * 3
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x).sum().backward()  # Average: the average of the ones
    assert x.grad.tolist() == [1.0] * 3
    a = torch.ones(r + 1, 2, requires_grad=True)
    g = hvd.allgather(a)
    (g * torch.arange(g.shape[0]).unsqueeze(1)).sum().backward()
    off = sum(k + 1 for k in range(r))
    assert a.grad.tolist() == [[float(off + i)] * 2 for i in range(r + 1)]
    b = torch.ones(2, requires_grad=True)
    (hvd.broadcast(b, 0) * 3).sum().backward()
    assert b.grad.tolist() == ([3.0, 3.0] if r == 0 else [0.0, 0.0])
    s = torch.ones(2 * n, requires_grad=True)
    out, _ = hvd.alltoall(s, splits=[2] * n)
    (out * (r + 1)).sum().backward()
    assert s.grad.tolist() == [float(j + 1) for j in range(n) for _ in range(2)]
    t = torch.ones(n, 2, requires_grad=True)
    hvd.reducescatter(t, op=hvd.Sum).sum().backward()
    assert t.grad.tolist() == [[float(n), float(n)]] * n  # Horovod: allgather(grad) * size
    ga = [torch.ones(2, requires_grad=True), torch.ones(1, requires_grad=True)]
    outs = hvd.grouped_allreduce(ga, op=hvd.Sum)
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    assert ga[0].grad.tolist() == [float(n)] * 2 and ga[1].grad.tolist() == [2.0 * n]


def test_gradients_flow_through_collectives() -> None:
    hvd_spawn(_gradients, 2)
