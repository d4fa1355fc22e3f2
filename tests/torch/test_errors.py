"""Failure behaviour users rely on: mismatches raise on every rank, duplicate names
raise ValueError, async operations run in the background, a lost peer fails pending work."""

from __future__ import annotations

import time

import pytest

from ._util import hvd_outcomes, hvd_spawn

pytestmark = pytest.mark.timeout(120)


def _mismatch(kind: str) -> str:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    with pytest.raises(hvd.TensorMismatchError) as info:
        if kind == "shape":
            hvd.allreduce(torch.ones(3 + r), name="m")
        elif kind == "dtype":
            hvd.allreduce(torch.ones(3, dtype=torch.float32 if r else torch.float64), name="m")
        elif kind == "op":
            hvd.allreduce(torch.ones(3), op=hvd.Sum if r else hvd.Max, name="m")
        elif kind == "root":
            hvd.broadcast(torch.ones(3), root_rank=r, name="m")
        else:
            hvd.allgather(torch.ones(2, 2 + r), name="m")
    assert isinstance(info.value, RuntimeError)
    # the engine stays usable after a mismatch
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [2.0, 2.0]
    return str(info.value)


@pytest.mark.parametrize("kind", ["shape", "dtype", "op", "root", "allgather"])
def test_mismatch_raises_on_every_rank(kind: str) -> None:
    msgs = hvd_spawn(_mismatch, 2, kind)
    assert all("'m'" in m for m in msgs)


def _duplicate_and_async() -> None:
    import torch

    import unison.torch as hvd

    r = hvd.rank()
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), name="dup")
        with pytest.raises(ValueError, match="already being processed"):
            hvd.allreduce_async(torch.ones(2), name="dup")
        time.sleep(0.5)  # rank 1 has not submitted yet: still in flight
        assert not hvd.poll(h)
        hvd.barrier()
    else:
        time.sleep(0.8)
        h = hvd.allreduce_async(torch.ones(2), name="dup")
        hvd.barrier()
    assert hvd.synchronize(h).tolist() == [1.0, 1.0]
    assert hvd.poll(h)
    with pytest.raises(ValueError):
        hvd.poll(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())
    # the same name again after completion is fine
    assert hvd.allreduce(torch.ones(1), name="dup", op=hvd.Sum).tolist() == [2.0]


def test_duplicate_name_and_async_in_background() -> None:
    hvd_spawn(_duplicate_and_async, 2)


def _reuse_right_after_completion() -> int:
    """Horovod's test_horovod_*_duplicate_name_error: rank 0's operation waits for rank 1,
    whose own submission completes it at once; reusing the name right away, before the
    result is collected, is a duplicate in Horovod (its engine takes submissions once a
    cycle), and must be here too however soon the engine decided it."""
    import torch

    import unison.torch as hvd

    r, raised = hvd.rank(), 0
    for i in range(20):
        name = f"dup{i}"
        first = 0 if i % 2 else 1  # each rank in turn submits second
        if r == first:
            hvd.allgather_async(torch.ones(3), name=name)
        hvd.barrier()
        if r != first:
            hvd.allgather_async(torch.ones(3), name=name)
            try:
                hvd.allgather_async(torch.ones(3), name=name)
            except ValueError:
                raised += 1
        hvd.barrier()
    # a collected result frees its name at once: a loop of synchronous calls reuses it
    for _ in range(50):
        assert hvd.allreduce(torch.ones(1), name="loop", op=hvd.Sum).tolist() == [2.0]
    # and an uncollected one a moment later (Horovod frees it once decided)
    hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum)
    time.sleep(0.2)  # both ranks submitted: long decided
    hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum))
    return raised


def test_name_reused_right_after_a_completed_uncollected_operation_is_a_duplicate() -> None:
    assert hvd_spawn(_reuse_right_after_completion, 2) == [10, 10]


def _different_orders() -> list[float]:
    import torch

    import unison.torch as hvd

    names = [f"t{i}" for i in range(12)]
    if hvd.rank() == 1:
        names.reverse()
    hs = {
        n: hvd.allreduce_async(torch.full((3,), float(i)), name=n, op=hvd.Sum)
        for i, n in enumerate(names)
    }
    return [hvd.synchronize(hs[f"t{i}"])[0].item() for i in range(12)]


def test_ranks_may_submit_in_different_orders() -> None:
    a, b = hvd_spawn(_different_orders, 2)
    assert a == b == [float(i + 11 - i) for i in range(12)]


def _peer_dies() -> None:
    import os

    import torch

    import unison.torch as hvd
    from unison.torch.basics import engine_of

    # rank 0 waits for its cycle messages asleep (as where ranks outnumber cores): the
    # transport's own progress must still report the loss
    engine_of(hvd.global_process_set).channel.sleep_wait = True
    hvd.allreduce(torch.ones(1), name="warm")
    if hvd.rank() == 1:
        time.sleep(0.5)  # rank 0 is most likely waiting for its cycle message by then
        os._exit(3)
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(torch.ones(1), name="after-death")
    # the loss itself is reported (naming the rank), not a negotiation timeout later
    assert "rank 1" in str(info.value) and "timed out" not in str(info.value), info.value


def test_a_lost_peer_fails_pending_operations() -> None:
    outs = hvd_outcomes(_peer_dies, 2, env={"UNISON_TIMEOUT": "10"}, timeout=60)
    assert outs[0].ok, outs[0].describe()
    assert not outs[1].ok


def _stall_shutdown() -> None:
    import torch

    import unison.torch as hvd

    if hvd.rank() == 0:
        with pytest.warns(RuntimeWarning, match="missing on ranks \\[1\\]"):
            with pytest.raises(hvd.TensorMismatchError, match="stalled"):
                hvd.allreduce(torch.ones(1), name="lonely")
    else:
        time.sleep(3.0)  # past the shutdown time of rank 0's tensor
    hvd.barrier()


def test_stall_inspector_warns_and_shuts_the_tensor_down() -> None:
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    hvd_spawn(_stall_shutdown, 2, env=env)
