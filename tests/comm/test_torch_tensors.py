"""Torch CPU tensors through the collectives, every dtype including bfloat16."""

from __future__ import annotations

import pytest

from unison.testing import spawn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(90)


def _body() -> None:
    import torch

    import unison as un

    r, p = un.rank(), un.size()
    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
    ):
        t = torch.full((3, 5), r + 1, dtype=dt)
        un.all_reduce(t)
        assert torch.equal(t, torch.full((3, 5), sum(range(1, p + 1)), dtype=dt)), (dt, t)
        g = [torch.empty(2, dtype=dt) for _ in range(p)]
        un.all_gather(g, torch.full((2,), r, dtype=dt))
        assert [int(x[0]) for x in g] == list(range(p))
    m = torch.tensor([r % 2 == 0, True])
    un.all_reduce(m, op=un.ReduceOp.BAND)
    assert m.tolist() == [p == 1, True]
    avg = torch.full((4,), float(r), dtype=torch.bfloat16)
    un.all_reduce(avg, op=un.ReduceOp.AVG)
    assert torch.allclose(avg.float(), torch.full((4,), (p - 1) / 2), atol=1e-2)
    w = torch.zeros(10, requires_grad=True)  # a leaf that requires grad: data updated in place
    un.broadcast(w.data if r else w.data.fill_(3.0), src=0)
    assert float(w.detach()[0]) == 3.0
    if r == 0:
        un.send(torch.arange(4, dtype=torch.int32), dst=1)
    elif r == 1:
        x = torch.empty(4, dtype=torch.int32)
        un.recv(x, src=0)
        assert x.tolist() == [0, 1, 2, 3]
    with pytest.raises(un.InvalidArgumentError, match="contiguous"):
        un.all_reduce(torch.zeros(4, 4).t())


def test_torch_tensors_in_collectives() -> None:
    spawn(_body, 3)
