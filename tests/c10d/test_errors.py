"""unison's typed errors reach torch.distributed users as DistBackendError naming rank and op."""

from __future__ import annotations

from . import _errors
from ._util import run, values


def test_mismatch_and_timeout_are_torch_errors_naming_ranks() -> None:
    outs = values(run(_errors.mismatch_and_timeout, 3, timeout=100))
    name, text = outs[0]["monitored"]  # Gloo's message: rank 0 names the missing rank
    assert name == "DistBackendError", outs[0]["monitored"]
    assert text.startswith("[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms"), text
    name, text = outs[1]["monitored"]  # the others learn that rank 0 did not release them
    assert name == "DistBackendError" and "Rank 1 successfully reached monitoredBarrier" in text
    for r in (0, 1):
        name, text = outs[r]["mismatch"]
        assert outs[r]["mismatch_types"] == (True, True, True), outs[r]
        assert "all_reduce" in text and "rank" in text, text
        assert name == "DistMismatchError"
        name, text = outs[r]["timeout"]
        assert outs[r]["timeout_types"] == (True, True, True), outs[r]
        assert "rank 2" in text and "all_reduce" in text, text
        assert "CollectiveTimeoutError" in outs[r]["exception"]


def test_dead_rank_is_named() -> None:
    outs = run(_errors.dead_rank, 2, timeout=100)
    assert outs[0].ok, outs[0].describe()
    _name, text = outs[0].value["error"]
    assert outs[0].value["types"] == (True, True), outs[0].value
    assert "rank 1" in text, text


def test_work_wait_timeout_leaves_operation_running() -> None:
    outs = values(run(_errors.work_wait_timeout, 2, timeout=100))
    assert outs[0]["early"] == ("DistCollectiveTimeoutError", True), outs[0]
    assert outs[0]["completed_early"] is False
    assert outs[0]["value"] == [5.0, 6.0]
    assert outs[0]["sum"] == [2.0, 2.0, 2.0], outs[0]


def test_bfloat16_against_float32_is_a_mismatch_on_every_rank() -> None:
    """bfloat16 is staged as float32; the signature still names bfloat16 (it named the
    staged float32: rank 0's bfloat16 all_reduce was summed with the others' float32)."""
    outs = values(run(_errors.bfloat16_against_float32, 3, timeout=100))
    for r, out in enumerate(outs):
        for case in (
            "all_reduce_small",
            "all_reduce_large",
            "all_reduce_async",
            "broadcast",
            "all_gather",
            "reduce",
        ):
            name, text, typed, op = out[case]
            assert name == "DistMismatchError" and typed, (r, case, name, text)
            assert op == case.split("_small")[0].split("_large")[0].split("_async")[0], (r, op)
            assert "bfloat16" in text and "float32" in text and "rank 0" in text, (r, text)
        assert out["sum"] == [6.0, 6.0, 6.0], out  # 1 + 2 + 3, against the numpy oracle


def test_subgroup_timeout_is_the_deadline_of_its_collectives() -> None:
    """new_group(timeout=2 s) bounds every collective on the group (it bounded only a
    blocking barrier: an all_reduce waited out the default group's 60 s)."""
    outs = values(run(_errors.subgroup_deadline, 3, timeout=100))
    for r in (0, 1):
        for n in (8, 300_000):
            name, text, elapsed, typed, op, ranks = outs[r][n]
            assert name == "DistCollectiveTimeoutError" and typed, (r, n, name, text)
            assert op == "all_reduce" and ranks == [2], (r, n, op, ranks, text)
            assert "rank 2" in text and "all_reduce" in text, text
            assert 1.0 < elapsed < 20.0, (r, n, elapsed)  # the group's 2 s, not the job's 60 s
    for out in outs:
        assert out["sum"] == [6.0] * 4, out  # 1 + 2 + 3 on the default group
