"""The elastic form on the two-node test cluster: a worker's actor is killed mid-training,
its node is blacklisted for a 1 s cool-down, the survivors roll back and go on as a world
of 2, then the node's slot comes back and the world grows to 3 again; every rank of the
last world ends with the same parameters and the full number of steps."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'unison[ray]')")
pytest.importorskip("torch", reason="the elastic job uses unison.torch")

from unison.errors import UnsupportedError
from unison.ray import RayExecutor


def elastic_train(steps: int, grow_back_to: int) -> dict[str, Any]:
    import torch

    import unison.torch as hvd
    from unison import elastic

    hvd.init()
    torch.manual_seed(0)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = hvd.elastic.TorchState(model, opt, step=0)
    started = time.monotonic()

    @hvd.elastic.run
    def train(state: Any) -> None:
        # the full steps, then on until the world has grown back (at most 90 s)
        while state.step < steps or (hvd.size() < grow_back_to and time.monotonic() - started < 90):
            if state.step == 5 and hvd.rank() == 2 and elastic.current_round() == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost worker
            opt.zero_grad()
            batch = [(state.step * 8 + i) % 64 for i in range(8)]
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            for i, p in enumerate(model.parameters()):
                assert p.grad is not None
                # named: unnamed tensors' counters differ between survivors and new ranks
                p.grad.copy_(hvd.allreduce(p.grad, name=f"grad{i}"))
            opt.step()
            state.step += 1
            state.commit()

    train(state)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    out = {"rank": hvd.rank(), "size": hvd.size(), "round": elastic.current_round()}
    out.update(step=state.step, params=flat)
    hvd.shutdown()
    return out


@pytest.mark.usefixtures("ray_local")
@pytest.mark.timeout(240)
def test_lost_worker_then_world_grows_back() -> None:
    ex = RayExecutor(None, min_workers=2, max_workers=3, cooldown_range=[1, 1], elastic_timeout=60)
    ex.start()
    try:
        results = ex.run(elastic_train, args=[20, 3])
        log = list(ex._elastic.log) if ex._elastic else []
    finally:
        ex.shutdown()
    assert log[0] == "world 0: 3 workers (start)"
    assert any("rank 2" in line and "actor died" in line for line in log), log
    assert any(line.startswith("world 1: 2 workers") for line in log), log
    assert any("workers (new slots" in line for line in log), log
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert {r["size"] for r in results} == {3}
    assert len({r["round"] for r in results}) == 1 and results[0]["round"] >= 2
    assert all(r["step"] >= 20 for r in results)
    assert all(r["params"] == results[0]["params"] for r in results)
    with pytest.raises(UnsupportedError, match="only run"):
        ex.execute(lambda _: 0)
