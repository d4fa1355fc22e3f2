"""DistributedOptimizer against a single-process oracle; broadcast of every optimizer's
state; Horovod's argument checks and warnings."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from ._util import hvd_spawn

pytestmark = pytest.mark.timeout(120)


def _model():  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches(n: int):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)) for _ in range(5)]


def _oracle(passes: int, kw: dict) -> list:  # type: ignore[type-arg]
    """The same training in one process on the whole batch."""
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        (loss * passes).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train(passes: int, kw: dict) -> list:  # type: ignore[type-arg]
    import torch

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), backward_passes_per_step=passes, **kw
    )
    assert isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)
    for x, y in _batches(8):
        xs, ys = x.chunk(n)[r], y.chunk(n)[r]
        opt.zero_grad()
        for _ in range(passes):  # accumulate locally, reduce once
            torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
        sched.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize(
    ("passes", "kw", "overlap"),
    [
        (1, {}, "on"),
        (1, {}, "off"),
        (2, {}, "on"),
        (2, {}, "off"),
        (1, {"compression": "fp16"}, "on"),
        (1, {"compression": "fp16"}, "off"),
        (1, {"groups": 2}, "on"),
        (1, {"gradient_predivide_factor": 2.0}, "on"),
        (1, {"gradient_predivide_factor": 2.0}, "off"),
        (1, {"op": "Sum"}, "off"),
    ],
)
def test_distributed_optimizer_matches_single_process(passes: int, kw: dict, overlap: str) -> None:  # type: ignore[type-arg]
    """``overlap``: gradients reduced in the hooks during the backward pass (on) or all
    together at step() (off, the default where a rank has no core to spare)."""
    import torch

    import unison.torch as hvd

    kw = dict(kw)
    if kw.get("compression") == "fp16":
        kw["compression"] = hvd.Compression.fp16
    sum_op = kw.get("op") == "Sum"
    if sum_op:
        kw["op"] = hvd.Sum
    results = hvd_spawn(_train, 2, passes, kw, env={"UNISON_GRADIENT_OVERLAP": overlap})
    for a, b in zip(results[0], results[1], strict=True):
        assert (a == b).all(), "ranks diverged"
    if sum_op:
        return  # summed gradients: a different (larger) step than the oracle's mean
    tol = 2e-2 if "compression" in kw else 1e-5
    for got, want in zip(results[0], _oracle(passes, kw), strict=True):
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=tol, atol=tol)


def _checks() -> None:
    import warnings

    import torch

    import unison.torch as hvd

    model = _model()
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[params[0], ("0.weight", params[1][1]), *params[2:]],
        )
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params[:1]
        )
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=[p for _, p in params]
        )
    with pytest.raises(ValueError, match="op=Average"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum, gradient_predivide_factor=2.0
        )
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params
    )
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    opt.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.1
    opt.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model(torch.ones(1, 4)).sum().backward()
    opt.synchronize()


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_argument_checks_and_warnings(overlap: str) -> None:
    hvd_spawn(_checks, 2, env={"UNISON_GRADIENT_OVERLAP": overlap})


def _deferred(unused_on_rank1: bool, one_core: bool = False) -> bool:
    """Without overlap: after backward() every gradient is still this rank's own; after
    synchronize() it is the average (rank 1 may leave the second layer unused: its
    gradient counts as zeros, as with overlap). ``one_core``: the rank runs on one core
    (then this host has no more cores than ranks, whatever the machine)."""
    import os

    import torch

    if one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    import unison.torch as hvd

    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    # two dtypes: a group holds one, so the step reduces two groups
    first, second = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2).double()
    model = torch.nn.Sequential(first, torch.nn.Tanh(), second)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    x = torch.full((2, 4), float(r + 1))
    hidden = torch.tanh(first(x))
    out = hidden.sum(1) if unused_on_rank1 and r == 1 else second(hidden.double())
    out.sum().backward()
    local = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    time.sleep(0.2)  # with overlap, reductions would land meanwhile; here none started
    still_local = all(
        (g is None and p.grad is None) or (g is not None and torch.equal(p.grad, g))
        for p, g in zip(model.parameters(), local, strict=True)
    )
    opt.synchronize()
    params = list(model.parameters())
    mine = [torch.zeros_like(p) if g is None else g for p, g in zip(params, local, strict=True)]
    every = hvd.allgather_object([g.numpy() for g in mine])
    averaged = all(
        np.allclose(p.grad.numpy(), sum(e[i] for e in every) / n, rtol=1e-6, atol=1e-7)
        for i, p in enumerate(model.parameters())
    )
    with opt.skip_synchronize():
        opt.step()
    return still_local and averaged


@pytest.mark.parametrize("unused_on_rank1", [False, True])
def test_without_overlap_gradients_are_reduced_at_step(unused_on_rank1: bool) -> None:
    results = hvd_spawn(_deferred, 2, unused_on_rank1, env={"UNISON_GRADIENT_OVERLAP": "off"})
    assert results == [True, True]


def test_overlap_auto_defers_where_a_rank_has_no_core_to_spare() -> None:
    """auto: deferred where this host has no more cores than ranks (CPU tensors): each
    rank is held to one core, so the machine's own count does not decide."""
    assert hvd_spawn(_deferred, 2, False, True) == [True, True]


OPTIMIZERS = [
    "SGD",
    "Adam",
    "AdamW",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "ASGD",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SparseAdam",
    "LBFGS",
    "Adafactor",
    "Muon",
]


def _sparse_loss(emb, r):  # type: ignore[no-untyped-def]
    import torch

    return emb(torch.tensor([r % 5, 2])).sum()


def _dense_loss(lin, r):  # type: ignore[no-untyped-def]
    import torch

    return (lin(torch.ones(2, 3) * (r + 1)) ** 2).sum()


def _bcast_opt_state() -> list[str]:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    done = []
    for name in OPTIMIZERS:
        cls = getattr(torch.optim, name, None)
        if cls is None:
            continue
        torch.manual_seed(r)
        if name == "SparseAdam":
            emb = torch.nn.Embedding(5, 3, sparse=True)
            params = list(emb.parameters())
            loss_fn = functools.partial(_sparse_loss, emb, r)
        else:
            lin = torch.nn.Linear(3, 4, bias=False)
            params = list(lin.parameters())
            loss_fn = functools.partial(_dense_loss, lin, r)
        kwargs = {"lr": 0.01 * (r + 1)}
        try:
            opt = cls(params, **kwargs)
        except Exception:
            continue
        for _ in range(1 + r):  # different state on each rank
            opt.zero_grad()
            if name == "LBFGS":
                opt.step(lambda f=loss_fn: (f().backward(), f())[1])
            else:
                loss_fn().backward()
                opt.step()
        hvd.broadcast_parameters([(f"{name}.{i}", p) for i, p in enumerate(params)], 0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        sd = opt.state_dict()
        gathered = hvd.allgather_object(sd, name=f"check.{name}")
        a, b = gathered[0], gathered[-1]
        assert a["param_groups"][0]["lr"] == b["param_groups"][0]["lr"] == 0.01, name
        for k, st in a["state"].items():
            for key, v in st.items():
                other = b["state"][k][key]
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v, other), (name, key)
                elif isinstance(v, list):
                    assert len(v) == len(other), (name, key)
                else:
                    assert v == other, (name, key)
        done.append(name)
    return done


def test_broadcast_optimizer_state_of_every_optimizer() -> None:
    done = hvd_spawn(_bcast_opt_state, 2)[0]
    assert {"SGD", "Adam", "AdamW", "RMSprop", "LBFGS", "SparseAdam", "Adagrad"} <= set(done)
