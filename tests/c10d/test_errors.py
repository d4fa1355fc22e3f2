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
