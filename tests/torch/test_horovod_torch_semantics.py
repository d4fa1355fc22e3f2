"""Horovod's semantics that unison.torch keeps: what broadcast_optimizer_state leaves
behind, and what ElasticSampler.processed_num counts (np=2, real processes)."""

from __future__ import annotations

import pytest

from ._util import hvd_spawn


def _zero_grads() -> dict[str, object]:
    import torch

    import unison.torch as hvd

    torch.manual_seed(hvd.rank())
    index = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    weight = torch.nn.Parameter(torch.rand(4))
    opt = torch.optim.SGD([index, weight], lr=0.001, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=[("a", index), ("b", weight)])
    hvd.broadcast_parameters({"a": index, "b": weight}, root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = weight.grad
    out: dict[str, object] = {"frozen": index.grad is None, "grad": None}
    if grad is not None:
        # every rank has one, so a collective on it runs everywhere
        out["grad"] = hvd.broadcast(grad, root_rank=0).tolist()
        out["mine"] = grad.tolist()
    return out


@pytest.mark.timeout(120)
def test_broadcast_optimizer_state_gives_grad_less_parameters_a_zero_gradient() -> None:
    """A fresh optimizer: every parameter that requires a gradient has a zero one after
    the broadcast (Horovod's test_broadcast_state_no_grad); a frozen one has none."""
    for r, out in enumerate(hvd_spawn(_zero_grads, 2, timeout=100)):
        assert out["frozen"] is True, r
        assert out["grad"] == [0.0] * 4, r
        assert out["mine"] == [0.0] * 4, r


def _sampler_counts() -> dict[str, object]:
    import unison.torch as hvd

    bs, n = 2, hvd.size()
    s = hvd.elastic.ElasticSampler(list(range(8 * n)), shuffle=True)
    state = hvd.elastic.TorchState(sampler=s)
    state.sync()
    seen: list[int] = []
    for batch_idx in range(3):
        s.record_batch(batch_idx, bs)
        seen.append(s.processed_num)
    state.commit()
    s.record_batch(3, bs)
    after_extra = s.processed_num
    state.restore()
    restored = s.processed_num
    state.sync()
    return {
        "seen": seen,
        "extra": after_extra,
        "restored": restored,
        "synced": s.processed_num,
        "left": len(s),
        "mine": list(s),
    }


@pytest.mark.timeout(120)
def test_elastic_sampler_processed_num_counts_this_workers_samples() -> None:
    """record_batch counts this worker's samples (batch_size * (batch_idx + 1)); a sync
    turns the count into every worker's, and the rest of the epoch is re-sharded."""
    outs = hvd_spawn(_sampler_counts, 2, timeout=100)
    for out in outs:
        assert out["seen"] == [2, 4, 6]
        assert out["extra"] == 8 and out["restored"] == 6
        assert out["synced"] == 6 * 2
        assert out["left"] == 2
    # the 4 samples left of 16 are split between the two workers, none twice
    assert len(set(outs[0]["mine"]) | set(outs[1]["mine"])) == 4  # type: ignore[arg-type]
