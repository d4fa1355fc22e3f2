"""What PyTorch's own distributed suite checks of a backend, on backend "unison".

Each test holds unison to the behaviour the suite (torch's ``DistributedTest``)
expects of Gloo: sparse all_reduce, a group's own timeout, torch's public
``monitored_barrier`` and its messages, a late rank at a ``file://`` rendezvous, and
profiler events ``unison:<op>`` as torch's backends record theirs.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from . import _suite_jobs
from ._util import run, values


def test_sparse_all_reduce_sums_coo_tensors() -> None:
    outs = values(run(_suite_jobs.sparse_all_reduce, 3, timeout=100))
    for o in outs:
        assert o["ok"] and o["sub_ok"], o
        assert o["empty"] == 0, o
        name, text = o["max_error"]
        assert name != "NoneType" and "SUM" in text, o


def test_barrier_raises_once_the_groups_own_timeout_passed() -> None:
    outs = values(run(_suite_jobs.group_timeout_barrier, 2, timeout=100))
    o = outs[0]
    assert o["matches"], o  # the text torch's suite expects of Gloo
    assert o["types"] == (True, True), o
    assert "barrier" in o["error"][1] and "rank 0" in o["error"][1], o
    # raised after the group's 1 s, and before rank 1 (alive for 20 s) gave up
    assert 0.9 <= o["elapsed"] < 15.0, o


def test_torch_monitored_barrier_on_unison_groups() -> None:
    outs = values(run(_suite_jobs.monitored_barrier, 3, timeout=100))
    name, text = outs[0]["absent"]
    assert name == "DistBackendError", outs[0]
    assert "Rank 1 failed to pass monitoredBarrier in 2000 ms" in text, text
    name, text = outs[2]["absent"]
    assert "Rank 2 successfully reached monitoredBarrier" in text, text
    name, text = outs[0]["rank0"]
    assert name == "DistBackendError" and "Rank 0 timed out in monitoredBarrier" in text, text
    assert outs[2]["non_member"] is None, outs[2]
    assert "Rank 1 failed to pass monitoredBarrier in 1000 ms" in outs[0]["pair_absent"][1]
    assert all(o["gloo"] == "gloo" for o in outs), outs


@pytest.mark.parametrize("delay", [3.0])
def test_file_rendezvous_waits_for_a_late_rank(delay: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rendezvous")
        outs = values(run(_suite_jobs.late_file_rendezvous, 2, args=(path, delay), timeout=100))
    assert outs == [[3.0] * 4, [3.0] * 4], outs


@pytest.mark.parametrize("kind", ["autograd", "torch"])
def test_profiler_records_each_operation_as_unison_events(kind: str) -> None:
    outs = values(run(_suite_jobs.profiler_events, 2, args=(kind,), timeout=100))
    for rank, seen in enumerate(outs):
        # one event per call, asynchronous, with the input tensors' shapes
        assert seen["unison:all_reduce"] == [(True, [[3, 2]], 1), (True, [[2, 5]], 1)] or sorted(
            seen["unison:all_reduce"]
        ) == sorted([(True, [[3, 2]], 1), (True, [[2, 5]], 1)]), seen
        assert seen["unison:broadcast"] == [(True, [[3, 2]], 1)], seen
        assert seen["unison:all_gather"] == [(True, [[4]], 1)], seen
        assert seen["unison:barrier"] == [(True, [], 1)], seen
        p2p = "unison:send" if rank == 0 else "unison:recv"
        assert seen[p2p] == [(True, [[7]], 1)], seen
        assert len(seen) == 5, seen  # nothing else, and nothing after the profiler


def test_p2p_events_are_ended_before_wait_returns() -> None:
    outs = values(run(_suite_jobs.profiled_p2p_rounds, 2, args=(40,), timeout=150))
    assert outs == [[2] * 40, [2] * 40], outs
