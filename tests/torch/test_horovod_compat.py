"""Horovod's behaviour where users found unison.torch differed (issue 12): alltoall with
rank-specific splits, every op's gradient as Horovod defines it, local argument checks
that leave the engine usable, join() with other collectives, timeouts that name the
ranks that have not submitted. Several checks per spawned job to keep the suite short."""

from __future__ import annotations

import numpy as np
import pytest

from ._util import hvd_spawn

pytestmark = pytest.mark.timeout(120)

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
SHAPES = [(), (2,), (2, 3)]  # trailing dims: 1-D to 3-D tensors


def _rows(rank: int, dest: int, count: int, dtype: str, rest: tuple[int, ...]) -> np.ndarray:
    """The rows ``rank`` sends to ``dest``: value 10*rank + dest (fits every dtype)."""
    return np.full((count, *rest), 10 * rank + dest, dtype=dtype)


def _alltoall_matrix() -> None:
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    for dt in DTYPES:
        for rest in SHAPES:
            # rank r sends r + 1 + j rows to rank j: send and receive counts all differ
            sends = [r + 1 + j for j in range(n)]
            t = torch.from_numpy(
                np.concatenate([_rows(r, j, sends[j], dt, rest) for j in range(n)])
            )
            for form in ("tensor", "list"):
                sp = torch.tensor(sends, dtype=torch.int32) if form == "tensor" else sends
                out, received = hvd.alltoall(t, splits=sp, name=f"a2a.{dt}.{len(rest)}.{form}")
                want = np.concatenate([_rows(k, r, k + 1 + r, dt, rest) for k in range(n)])
                np.testing.assert_array_equal(out.numpy(), want)
                assert out.dtype == t.dtype
                assert received.tolist() == [k + 1 + r for k in range(n)]
                assert received.dtype == torch.int32
            # default splits: equal parts
            even = torch.from_numpy(np.concatenate([_rows(r, j, 2, dt, rest) for j in range(n)]))
            got = hvd.alltoall(even)
            assert isinstance(got, torch.Tensor)
            np.testing.assert_array_equal(
                got.numpy(), np.concatenate([_rows(k, r, 2, dt, rest) for k in range(n)])
            )
    # one name again and again (the response cache) while only rank 0's splits change
    for it in range(3):
        sends = [it + 1 if r == 0 else 1] * n
        o, rs = hvd.alltoall(torch.full((sum(sends),), r), splits=sends, name="a2a.again")
        assert rs.tolist() == [it + 1] + [1] * (n - 1)
        assert o.tolist() == [0] * (it + 1) + [k for k in range(1, n)]
    # int64 splits tensor: received splits come back in the splits' dtype (Horovod)
    t = torch.arange(2 * n, dtype=torch.float32)
    h = hvd.alltoall_async(t, splits=torch.full((n,), 2, dtype=torch.int64))
    _o, rs = hvd.synchronize(h)
    assert rs.dtype == torch.int64 and rs.tolist() == [2] * n
    # splits summing to less than the first dimension: the first sum(splits) rows (Horovod)
    o, rs = hvd.alltoall(torch.arange(n + 3) + 100 * r, splits=[1] * n)
    assert o.tolist() == [100 * k + r for k in range(n)]
    # a process set of two of the ranks, with rank-specific splits
    pset = hvd.add_process_set([0, n - 1])
    if pset.included():
        me = pset.rank()
        o, rs = hvd.alltoall(torch.full((3 + me,), r), splits=[1 + me, 2], process_set=pset)
        assert rs.tolist() == ([1, 2] if me == 0 else [2, 2])
        assert o.tolist() == ([0] + [n - 1] * 2 if me == 0 else [0, 0, n - 1, n - 1])
    hvd.remove_process_set(pset)


def _gradients() -> None:
    """Every differentiable op's backward, with upstream gradient (rank + 1) so averaging
    and summing differ, against Horovod's definitions."""
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    up = float(r + 1)
    mean_up = (n + 1) / 2  # average over ranks of the upstream gradients
    sum_up = n * (n + 1) / 2

    def grad_of(fn, x):  # type: ignore[no-untyped-def]
        x = x.clone().requires_grad_(True)
        out = fn(x)
        outs = out if isinstance(out, (list, tuple)) else [out]
        torch.autograd.backward(list(outs), [torch.full_like(o, up) for o in outs])
        return x.grad

    x = torch.ones(4, 2)
    # allreduce: the allreduce of the gradient with the same op
    g = grad_of(lambda v: hvd.allreduce(v, op=hvd.Sum), x)
    assert torch.allclose(g, torch.full_like(x, sum_up))
    g = grad_of(lambda v: hvd.allreduce(v), x)
    assert torch.allclose(g, torch.full_like(x, mean_up))
    g = grad_of(lambda v: hvd.allreduce(v, op=hvd.Sum, prescale_factor=2.0), x)
    assert torch.allclose(g, torch.full_like(x, 2 * sum_up))
    # grouped_allreduce
    x2 = torch.ones(3)
    xs = [x.clone().requires_grad_(True), x2.clone().requires_grad_(True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    torch.autograd.backward(outs, [torch.full_like(o, up) for o in outs])
    assert all(torch.allclose(v.grad, torch.full_like(v, sum_up)) for v in xs)
    # allgather: averaged gradient, this rank's rows
    mine = torch.ones(r + 1, 2)
    g = grad_of(lambda v: hvd.allgather(v), mine)
    assert g.shape == mine.shape and torch.allclose(g, torch.full_like(mine, mean_up))
    # grouped_allgather
    ys = [torch.ones(r + 1, 2).requires_grad_(True), torch.ones(1).requires_grad_(True)]
    outs = hvd.grouped_allgather(ys)
    torch.autograd.backward(outs, [torch.full_like(o, up) for o in outs])
    assert all(torch.allclose(v.grad, torch.full_like(v, mean_up)) for v in ys)
    # broadcast: averaged gradient on the root, zero elsewhere
    g = grad_of(lambda v: hvd.broadcast(v, root_rank=1), x)
    assert torch.allclose(g, torch.full_like(x, mean_up if r == 1 else 0.0))
    # alltoall: the gradient goes back along the received splits
    sends = [1 + j for j in range(n)]  # rank r sends j + 1 rows to rank j
    t = torch.ones(sum(sends), 2)
    g = grad_of(lambda v: hvd.alltoall(v, splits=sends)[0], t)
    want = torch.cat([torch.full((j + 1, 2), float(j + 1)) for j in range(n)])
    assert torch.equal(g, want)
    g = grad_of(lambda v: hvd.alltoall(v), torch.ones(n, 3))
    assert torch.equal(g, torch.arange(1, n + 1, dtype=torch.float32)[:, None].expand(n, 3))
    # reducescatter: allgather of the gradient, times size for Sum (Horovod's definition)
    rows = [2, 1, 1][:n] if n == 3 else [2, 2]
    z = torch.ones(sum(rows), 2)
    owner = torch.cat([torch.full((k, 2), float(j + 1)) for j, k in enumerate(rows)])
    g = grad_of(lambda v: hvd.reducescatter(v, op=hvd.Sum), z)
    assert torch.equal(g, owner * n), g
    g = grad_of(lambda v: hvd.reducescatter(v, op=hvd.Average), z)
    assert torch.equal(g, owner), g
    # grouped_reducescatter has a gradient too
    zs = [z.clone().requires_grad_(True), torch.ones(n, 1).requires_grad_(True)]
    outs = hvd.grouped_reducescatter(zs, op=hvd.Sum)
    torch.autograd.backward(outs, [torch.full_like(o, up) for o in outs])
    assert torch.equal(zs[0].grad, owner * n)
    assert torch.equal(zs[1].grad, torch.arange(1, n + 1, dtype=torch.float32)[:, None] * n)


def _local_checks() -> None:
    """Bad arguments raise at the call, on the rank that made them; the engine goes on."""
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    t = torch.ones(2 * n)
    with pytest.raises(ValueError, match="out of range"):
        hvd.broadcast(t, root_rank=n + 3)
    with pytest.raises(ValueError, match="out of range"):
        hvd.broadcast_async_(t, root_rank=-1)
    with pytest.raises(ValueError, match="Sum of splits entries is greater"):
        hvd.alltoall(t, splits=[2 * n] * n)
    with pytest.raises(ValueError, match="Number of entries in splits"):
        hvd.alltoall(t, splits=[1])
    with pytest.raises(ValueError, match="integers"):
        hvd.alltoall(t, splits=torch.ones(n))
    with pytest.raises(ValueError, match="even multiple"):
        hvd.alltoall(torch.ones(n + 1))
    gone = hvd.add_process_set(list(range(n)))
    hvd.remove_process_set(gone)
    for call in (
        lambda: hvd.allreduce(t, process_set=gone),
        lambda: hvd.allgather(t, process_set=gone),
        lambda: hvd.broadcast(t, 0, process_set=gone),
        lambda: hvd.alltoall(t, process_set=gone),
        lambda: hvd.reducescatter(t, process_set=gone),
        lambda: hvd.barrier(process_set=gone),
    ):
        with pytest.raises(ValueError, match="not registered"):
            call()
    # the engine is still usable, with the same automatic names on every rank
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [float(n)]
    assert hvd.broadcast(torch.tensor([r]), root_rank=n - 1).tolist() == [n - 1]


def _join_then_others() -> list[str]:
    """Rank n-1 joins at once; the others run every collective: allreduce works (the
    joined rank adds zeros), the rest raise Horovod's RuntimeError on every rank that
    called them, and training goes on."""
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    seen: list[str] = []
    if r == n - 1:
        return [f"last={hvd.join()}"]
    attempts = {
        "allgather": lambda: hvd.allgather(torch.ones(1)),
        "broadcast": lambda: hvd.broadcast(torch.ones(1), root_rank=0),
        "alltoall": lambda: hvd.alltoall(torch.ones(n)),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(n)),
    }
    for what, call in attempts.items():
        with pytest.raises(RuntimeError, match="not supported with Join") as info:
            call()
        assert isinstance(info.value, hvd.HorovodInternalError)
        seen.append(what)
        s = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{what}")
        assert s.tolist() == [float(n - 1)] * 2
    return [*seen, f"last={hvd.join()}"]


def _capabilities() -> None:
    """Horovod's run-time queries: MPI / Gloo enabled when the job's bytes move over them."""
    import os

    import unison.torch as hvd

    backend = os.environ["UNISON_BACKEND"]
    assert hvd.mpi_enabled() is (backend == "mpi")
    assert hvd.gloo_enabled() is (backend == "torch")  # torch's CPU process group is Gloo
    assert hvd.gloo_built() is True
    assert hvd.nccl_built() == 0 and type(hvd.nccl_built()) is int
    with pytest.raises(ValueError, match="Horovod MPI is not enabled"):
        hvd.mpi_threads_supported()


def _everything() -> list[str]:
    _capabilities()
    _alltoall_matrix()
    _gradients()
    _local_checks()
    return _join_then_others()


@pytest.mark.parametrize(("np_", "backend"), [(2, "native"), (3, "native"), (2, "torch")])
def test_horovod_collective_semantics(np_: int, backend: str) -> None:
    out = hvd_spawn(_everything, np_, env={"UNISON_BACKEND": backend}, timeout=110)
    assert out[0][:-1] == ["allgather", "broadcast", "alltoall", "reducescatter"]
    # join() returns the same last-joined rank everywhere, one of those that trained on
    lasts = {o[-1] for o in out}
    assert len(lasts) == 1 and lasts.pop() in {f"last={k}" for k in range(np_ - 1)}


def _timeouts() -> list[str]:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    msgs = []
    # rank 0 (the coordinator) waits for rank 1, and rank 1 (not the coordinator) for rank 0
    h = hvd.allreduce_async(torch.ones(1), name=f"only.on.{r}")
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.synchronize(h)
    msgs.append(str(info.value))
    assert list(info.value.ranks) == [1 - r]
    hvd.barrier()
    # once both have submitted, the same names complete
    h2 = hvd.allreduce_async(torch.ones(1), name=f"only.on.{1 - r}")
    assert hvd.synchronize(h2).tolist() == [1.0]
    assert hvd.synchronize(h).tolist() == [1.0]
    return msgs


def test_timeout_names_the_ranks_that_have_not_submitted() -> None:
    out = hvd_spawn(_timeouts, 2, env={"UNISON_TIMEOUT": "3"}, timeout=60)
    for r, (msg,) in enumerate(out):
        assert f"'only.on.{r}' did not complete within 3s" in msg
        assert f"ranks [{1 - r}] of the process set have not submitted it" in msg


def _naming_warning_state() -> None:
    """DistributedOptimizer names without named_parameters, Horovod's step() warning,
    broadcast_optimizer_state with parameters that never had a gradient."""
    import warnings

    import torch

    import unison.torch as hvd

    r = hvd.rank()
    torch.manual_seed(0)
    a, b, c = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
    inner = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}])
    inner.add_param_group({"params": c.parameters()})
    opt = hvd.DistributedOptimizer(inner)
    names = opt._parameter_names  # type: ignore[attr-defined]
    assert names[a.weight] == "allreduce.noname.0.0" and names[a.bias] == "allreduce.noname.0.1"
    assert names[b.weight] == "allreduce.noname.1.0" and names[c.bias] == "allreduce.noname.2.1"
    assert hvd.allgather_object(sorted(names.values())) == [sorted(names.values())] * hvd.size()
    named = hvd.DistributedOptimizer(
        torch.optim.SGD(a.parameters(), lr=0.1), named_parameters=a.named_parameters()
    )
    assert named._parameter_names == {a.weight: "weight", a.bias: "bias"}  # type: ignore[attr-defined]
    # the reduction is right with generated names: average of (r + 1)
    opt.zero_grad()
    (a(torch.ones(1, 2)).sum() * (r + 1)).backward()
    b(torch.ones(1, 2)).sum().backward()
    c(torch.ones(1, 1)).sum().backward()
    opt.synchronize()
    assert torch.allclose(a.bias.grad, torch.full((2,), (hvd.size() + 1) / 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in caught]
    assert any(
        t.startswith(
            "optimizer.step() called without optimizer.skip_synchronize() context after "
            "optimizer.synchronize(). This can cause training slowdown."
        )
        for t in texts
    ), texts
    # grad-less parameters: the optimizer holds no state for them (different ones per rank)
    for cls in (torch.optim.Adam, torch.optim.SGD, torch.optim.RMSprop, torch.optim.Adagrad):
        torch.manual_seed(r)
        m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        kw = {"momentum": 0.9} if cls is torch.optim.SGD else {}
        for p in m[2].parameters():  # frozen everywhere: never a gradient, never state
            p.requires_grad_(False)
        o = cls(m.parameters(), lr=0.1, **kw)
        if cls is torch.optim.Adam:
            o = hvd.DistributedOptimizer(o)
            m[0](torch.ones(1, 2)).sum().backward()
            o.step()
        else:  # a plain optimizer: rank r has state for layer r only
            m[r](torch.ones(1, 2)).sum().backward()
            o.step()
        hvd.broadcast_optimizer_state(o, root_rank=0)
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        mine = o.state_dict()
        root = hvd.broadcast_object(mine, root_rank=0, name=f"check.{cls.__name__}")
        assert sorted(mine["state"]) == sorted(root["state"]), cls
        for k, st in root["state"].items():
            for key, v in st.items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v, mine["state"][k][key]), (cls, key)


def _sparse(sparse_as_dense: bool) -> list[float]:
    """nn.Embedding(sparse=True) with SparseAdam: the gradient stays sparse (reduced by
    allgather, or densely with sparse_as_dense and handed back sparse, as Horovod)."""
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 3, sparse=True)
    opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(emb.parameters(), lr=0.1),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    for step in range(3):
        opt.zero_grad()
        idx = torch.tensor([(r + step) % 6, 5, r])
        (emb(idx) * (r + 1)).sum().backward()
        opt.step()
        assert emb.weight.grad.is_sparse
    return emb.weight.detach().flatten().tolist()


def _sparse_oracle(n: int) -> list[float]:
    import torch

    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 3, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        loss = sum((emb(torch.tensor([(r + step) % 6, 5, r])) * (r + 1)).sum() for r in range(n))
        (loss / n).backward()
        opt.step()
    return emb.weight.detach().flatten().tolist()


def _sync_bn_and_partial() -> dict[str, list[float]]:
    """SyncBatchNorm against one process's BatchNorm on the concatenated batch;
    PartialDistributedOptimizer keeps local layers' gradients local (scaled by 1/size)."""
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(5)
    x_all = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    coef = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    bn = hvd.SyncBatchNorm(3, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x = x_all[4 * r : 4 * r + 4].clone().requires_grad_(True)
    out = bn(x)
    (out * coef[4 * r : 4 * r + 4]).sum().backward()
    wgrad = hvd.allreduce(bn.weight.grad, op=hvd.Sum, name="bn.wgrad")
    with pytest.raises(ValueError, match="expected at least 2D input"):
        bn(torch.ones(3, dtype=torch.float64))
    bn.eval()
    ev = bn(x.detach())
    res = {
        "out": hvd.allgather(out.detach()).flatten().tolist(),
        "xgrad": hvd.allgather(x.grad).flatten().tolist(),
        "wgrad": wgrad.tolist(),
        "running": bn.running_mean.tolist() + bn.running_var.tolist(),
        "eval": hvd.allgather(ev).flatten().tolist(),
    }
    # PartialDistributedOptimizer: layer 0 is local, layer 1 shared
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    opt = hvd.PartialDistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), local_layers=[model[0]]
    )
    (model(torch.ones(1, 2) * (r + 1)).sum() * (r + 1)).backward()
    local_before = model[0].weight.grad.clone()
    opt.synchronize()
    assert torch.allclose(model[0].weight.grad, local_before / n)  # local, scaled 1/size
    shared = hvd.allgather(model[1].weight.grad.detach().clone())
    assert torch.allclose(shared[0], shared[-1])  # reduced: equal on every rank
    res["partial_shared"] = model[1].weight.grad.flatten().tolist()
    res["partial_local"] = local_before.flatten().tolist()
    return res


def _bn_oracle(n: int) -> dict[str, list[float]]:
    import torch

    g = torch.Generator().manual_seed(5)
    x_all = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    coef = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    bn = torch.nn.BatchNorm1d(3, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x = x_all.clone().requires_grad_(True)
    out = bn(x)
    (out * coef).sum().backward()
    bn.eval()
    return {
        "out": out.detach().flatten().tolist(),
        "xgrad": x.grad.flatten().tolist(),
        "wgrad": bn.weight.grad.tolist(),
        "running": bn.running_mean.tolist() + bn.running_var.tolist(),
        "eval": bn(x_all).detach().flatten().tolist(),
    }


def _partial_oracle(n: int) -> tuple[list[float], list[list[float]]]:
    """One process: the shared layer's gradient averaged over the ranks' batches, and
    each rank's own gradient of the local layer (what it keeps, before the 1/size)."""
    import torch

    shared, local = [], []
    for r in range(n):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        (model(torch.ones(1, 2) * (r + 1)).sum() * (r + 1)).backward()
        shared.append(model[1].weight.grad.flatten())
        local.append(model[0].weight.grad.flatten().tolist())
    return (sum(shared) / n).tolist(), local


def _training_extras() -> dict[str, object]:
    import unison.torch as hvd

    _naming_warning_state()
    out: dict[str, object] = {"sparse": _sparse(False), "dense": _sparse(True)}
    out.update(_sync_bn_and_partial())
    # ElasticSampler: Horovod's attributes and checkpoint format
    s = hvd.elastic.ElasticSampler(list(range(11)), shuffle=True, seed=3)
    first = list(s)
    assert s.processed_num == 0 and len(s) == len(first) == 6
    assert s.get_indices(1, 2) == first[2:4]
    s.record_batch(0, 2)
    sd = s.state_dict()
    assert sd == {"epoch": 0, "processed_num": 2, "processed_all": 2 * hvd.size()}
    t = hvd.elastic.ElasticSampler(list(range(11)), shuffle=True, seed=3)
    t.load_state_dict(sd)
    assert t.processed_num == 2 and t.remaining_indices == s.remaining_indices[4:]
    s.record_indices([t.remaining_indices[0]])
    s.reset()
    assert t.remaining_indices[0] not in s.remaining_indices
    s.set_epoch(1)
    assert s.processed_num == 0 and s.epoch == 1 and len(list(s)) == 6
    return out


def test_optimizer_sync_batch_norm_sampler_as_horovod() -> None:

    res = hvd_spawn(_training_extras, 2, timeout=110)
    np.testing.assert_allclose(res[0]["sparse"], _sparse_oracle(2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[1]["dense"], _sparse_oracle(2), rtol=1e-5, atol=1e-6)
    want = _bn_oracle(2)
    for key in ("out", "xgrad", "wgrad", "running", "eval"):
        for r in range(2):
            np.testing.assert_allclose(res[r][key], want[key], rtol=1e-9, atol=1e-9, err_msg=key)
    # shared layer: the average of both ranks' gradients; local layer: own gradient only
    assert res[0]["partial_shared"] == res[1]["partial_shared"]
    assert res[0]["partial_local"] != res[1]["partial_local"]
    shared, local = _partial_oracle(2)
    for r in range(2):
        np.testing.assert_allclose(res[r]["partial_shared"], shared, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(res[r]["partial_local"], local[r], rtol=1e-6, atol=1e-7)
