"""Process sets at np=4, join with uneven data, elastic restore, the timeline file."""

from __future__ import annotations

import json

import pytest

from ._util import hvd_spawn

pytestmark = pytest.mark.timeout(120)


def _process_sets() -> None:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    even = hvd.add_process_set([0, 2])
    odd = hvd.add_process_set(hvd.ProcessSet([1, 3]))
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    assert mine.included() and not other.included()
    assert mine.size() == 2 and mine.rank() == r // 2 and other.rank() == -1
    s = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="ps", process_set=mine)
    assert s.tolist() == ([2.0] if r % 2 == 0 else [4.0])
    g = hvd.allgather(torch.tensor([r]), process_set=mine)
    assert g.tolist() == ([0, 2] if r % 2 == 0 else [1, 3])
    b = hvd.broadcast(torch.tensor([r]), root_rank=mine.ranks[1], process_set=mine)
    assert b.tolist() == [mine.ranks[1]]
    with pytest.raises(ValueError, match="not a member"):
        hvd.allreduce(torch.ones(1), process_set=other)
    # the same name in two sets at once does not collide
    w = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="same")
    assert w.tolist() == [4.0, 4.0]
    assert hvd.allgather_object(r, process_set=mine) == mine.ranks
    hvd.barrier(process_set=mine)
    assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)
    assert not hvd.remove_process_set(even)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=mine)
    third = hvd.add_process_set([3, 1, 0])
    if third.included():
        x = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=third)
        assert x.tolist() == [3.0]
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [4.0]


def test_process_sets_np4() -> None:
    hvd_spawn(_process_sets, 4, timeout=90)


def _join() -> tuple[int, list[float]]:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    steps = 2 + r  # uneven data: rank r has 2 + r batches
    w = torch.zeros(3)
    for step in range(steps):
        g = torch.full((3,), float(r + 1))
        w += hvd.allreduce(g, op=hvd.Sum, name=f"grad.{step}")
    last = hvd.join()
    return last, w.tolist()


def test_join_with_uneven_data() -> None:
    out = hvd_spawn(_join, 3)
    assert [o[0] for o in out] == [2, 2, 2]
    # step 0 and 1: all ranks; step 2: ranks 1, 2 (rank 0 joined, contributes zeros); step 3: 2
    totals = [6.0 + 6.0, 6.0 + 6.0 + 5.0, 6.0 + 6.0 + 5.0 + 3.0]
    for r, (_, w) in enumerate(out):
        assert w == [totals[r]] * 3


def _elastic() -> list[float]:
    import torch

    import unison.torch as hvd

    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(2, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    hvd.broadcast_parameters(model.state_dict(), 0)
    w0 = model.weight.detach().clone()
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    failures = {"left": 1}
    seen: list[int] = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < 4:
            seen.append(state.epoch)
            opt.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            if state.epoch == 2 and failures["left"]:
                failures["left"] -= 1
                raise hvd.HorovodInternalError("simulated failure")
            state.epoch += 1
            state.commit()

    train(state)
    assert seen == [0, 1, 2, 2, 3], seen  # epoch 2 was redone from the last commit
    # four committed SGD steps on a gradient of ones; the failed step was rolled back
    assert torch.allclose(model.weight.detach(), w0 - 4 * 0.5), (model.weight, w0)
    return model.weight.detach().reshape(-1).tolist()


def test_elastic_restores_the_last_commit() -> None:
    a, b = hvd_spawn(_elastic, 2)
    assert a == b


def _sampler() -> list[int]:
    import unison.torch as hvd

    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=s)
    first = list(s)
    assert s.get_indices(0, 2) == first[:2]
    s.record_batch(0, 2)
    state.commit()
    s.record_batch(1, 2)
    state.restore()
    # Horovod's: this worker's count; unison adds every worker's
    assert s.state_dict() == {"epoch": 0, "processed_num": 2, "processed_all": 2 * hvd.size()}
    state.sync()  # what elastic.run does after a restore: the union of every rank's progress
    return list(s)


def test_elastic_sampler_skips_processed_samples() -> None:
    a, b = hvd_spawn(_sampler, 2)
    assert set(a) | set(b) == set(range(10)) - {0, 1, 2, 3}


def _timeline() -> None:
    import torch

    import unison.torch as hvd

    hs = [hvd.allreduce_async(torch.ones(100) * i, name=f"t{i}") for i in range(6)]
    for h in hs:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(2, 2), name="gathered")
    hvd.broadcast(torch.ones(2), 0, name="bcast")


def test_timeline_file_has_the_phases(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "timeline.json"
    hvd_spawn(_timeline, 2, env={"HOROVOD_TIMELINE": str(path)})
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "QUEUE", "ALLREDUCE", "ALLGATHER", "BROADCAST"} <= names
    rows = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"t0", "t5", "gathered", "bcast"} <= rows
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
