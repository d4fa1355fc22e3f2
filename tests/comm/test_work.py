"""Work's one wait loop, in one process: pushed, polled and joined completion."""

from __future__ import annotations

import threading

import pytest

from unison.comm.work import Work, joined
from unison.errors import CollectiveTimeoutError


def test_pushed_work_waits_for_another_thread_and_keeps_the_first_finish() -> None:
    w = Work("op")
    assert not w.is_completed() and w.exception() is None
    with pytest.raises(CollectiveTimeoutError, match="op did not complete within"):
        w.wait(0.01)
    go = threading.Event()

    def finisher() -> None:
        go.wait(10)
        w._finish("first")
        w._finish("second", RuntimeError("late"))

    t = threading.Thread(target=finisher)
    t.start()
    go.set()
    assert w.wait(10) is True
    t.join(10)
    assert w.result() == "first" and w.is_success() and w.exception() is None


def test_launch_runs_once_on_first_wait() -> None:
    starts: list[bool] = []
    w = Work("op", lambda inline: (starts.append(inline), w._finish(7)))
    assert w.wait() and w.result() == 7 and w.is_completed()
    assert starts == [False]


def test_polled_work_is_tested_until_done_and_raises_its_error() -> None:
    calls = []

    def progress(work: Work, budget: float | None) -> bool:
        calls.append(budget)
        if len(calls) < 5:
            return False
        work._finish(error=ValueError("engine said no"))
        return True

    w = Work("polled", progress=progress, polled=True)
    assert not w.is_completed()  # one test, no wait
    assert calls == [0.0]
    with pytest.raises(ValueError, match="engine said no"):
        w.wait()
    assert len(calls) == 5 and calls[-1] is None
    assert isinstance(w.exception(), ValueError)


def test_joined_fails_with_the_first_error_or_gives_its_result() -> None:
    a, b = Work("a"), Work("b")
    j = joined("both", [a, b], result={"k": 1})
    a._finish()
    assert not j.is_completed()
    b._finish()
    assert j.result() == {"k": 1}
    c, d = Work("c"), Work("d")
    c._finish(error=KeyError("c failed"))
    d._finish()
    bad = joined("both", [c, d])
    with pytest.raises(KeyError, match="c failed"):
        bad.wait()


def test_wait_quiet_reports_completion_and_never_raises() -> None:
    w = Work("op")
    assert w.wait_quiet(0.01) is False  # nobody finished it: False, no timeout error
    threading.Timer(0.05, lambda: w._finish(error=RuntimeError("engine said no"))).start()
    assert w.wait_quiet(10) is True  # finished with an error: True, the error not raised
    assert w.wait_quiet(0) is True
    with pytest.raises(RuntimeError, match="engine said no"):
        w.wait()
