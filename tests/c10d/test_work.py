"""The torch Work over unison operations: what its observers see, and when."""

from __future__ import annotations

import threading
import time

import pytest

from unison.comm.work import Work
from unison.torch.distributed._work import DoneWork, UnisonWork


@pytest.mark.timeout(30)
@pytest.mark.parametrize("waits", [True, False], ids=["waited", "unwaited"])
def test_on_finished_runs_before_wait_returns(waits: bool) -> None:
    # the profiler ends an operation's record this way: a wait that returned before
    # the record was ended let the profiler exit (and parse its records) while another
    # thread was still ending it, a crash in kineto
    part = Work("all_reduce")  # finished by another thread, as an engine's are
    work = UnisonWork("all_reduce", [part], [])
    seen: list[str] = []

    def slow_observer() -> None:
        time.sleep(0.3)
        seen.append(threading.current_thread().name)

    work.on_finished(slow_observer)
    engine = threading.Thread(target=lambda: (time.sleep(0.05), part.finish()), name="engine")
    engine.start()
    if waits:
        assert work.wait()
        assert len(seen) == 1, "wait returned before the observer ran"
    engine.join()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:  # nobody waits: the engine runs it
        time.sleep(0.01)
    assert len(seen) == 1 and work.is_completed(), seen
    later: list[int] = []
    work.on_finished(lambda: later.append(1))  # already finished: at once, here
    assert later == [1]
    if not waits:
        assert seen == ["engine"], seen


def test_on_finished_runs_once_on_failure_too() -> None:
    part = Work("broadcast")
    work = UnisonWork("broadcast", [part], [])
    calls: list[int] = []
    work.on_finished(lambda: calls.append(1))
    part.finish(error=RuntimeError("lost"))
    with pytest.raises(RuntimeError, match="lost"):
        work.wait()
    assert calls == [1]
    done: list[int] = []
    DoneWork("barrier", []).on_finished(lambda: done.append(1))
    assert done == [1]
