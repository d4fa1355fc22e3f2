"""A group without shared slots runs its small blocking all-reduces in the caller's
thread (``backends/native/message_calls.py``), and meets peers on the general path.

Every rank runs over TCP here, whatever transport the suite runs with. The failure paths
of such calls (a mismatch, a lost peer, an abort heard before the call) are the general
suite's (``test_failures.py``), which the TCP-forced run takes through this path."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison.testing import reduce_oracle, spawn

pytestmark = pytest.mark.timeout(90)
TCP = {"UNISON_TRANSPORT": "tcp", "UNISON_TIMEOUT": "60"}


def _in_caller_thread() -> tuple[bool, int, int, bool, bool]:
    g = un.get_world_group()
    ct = g.caller_thread
    assert ct is not None
    ex = ct.entry
    submitted: list[object] = []
    real = ex.submit  # type: ignore[attr-defined]

    def counting(*args: object, **kwargs: object) -> object:
        submitted.append(args[0])
        return real(*args, **kwargs)

    ex.submit = counting  # type: ignore[attr-defined]
    r, p = un.rank(), un.size()
    rng = np.random.default_rng(3)
    ok = True
    for i in range(20):
        dt = (np.float32, np.int64, np.float64)[i % 3]
        ins = [rng.integers(-9, 9, 1 + 7 * i).astype(dt) for _ in range(p)]
        x = ins[r].copy()
        op = (un.ReduceOp.SUM, un.ReduceOp.MAX)[i % 2]
        un.all_reduce(x, op=op)
        ok = ok and np.array_equal(x, reduce_oracle(ins, op))
    blocking = len(submitted)
    big = np.ones(100_000, np.float32)  # above the small-message bytes: the general path
    un.all_reduce(big)
    ok = ok and bool((big == p).all())
    un.all_reduce(np.ones(4), async_op=True).wait()
    return ok, blocking, len(submitted) - blocking, g.caller_thread_collectives, ct.every_collective


@pytest.mark.parametrize("np_", [2, 3])
def test_small_blocking_all_reduces_skip_the_work_and_queue(np_: int) -> None:
    for ok, blocking, later, claims, every in spawn(_in_caller_thread, np_, env=TCP):
        assert ok
        assert blocking == 0  # none took a Work
        assert later == 2  # the large and the async one did
        # the group does not claim every small collective (Horovod's gathered cycles)
        assert claims is False and every is False


def _mixed() -> list[float]:
    """Rank 0 has an async all-reduce in flight when it makes its blocking one, so its
    blocking call queues on the general path; the other ranks run theirs in the
    caller's thread. They must meet, in order."""
    r = un.rank()
    got: list[float] = []
    for k in range(30):
        a = np.full(3, float(r + k))
        b = np.full(5, 10.0 * (r + 1) + k)
        if r == 0:
            w = un.all_reduce(a, async_op=True)
            un.all_reduce(b)
            w.wait()
        else:
            un.all_reduce(a)
            un.all_reduce(b)
        got += [float(a[0]), float(b[0])]
    return got


def test_a_peer_on_the_general_path_meets_the_caller_thread_path() -> None:
    p = 3
    want: list[float] = []
    for k in range(30):
        want += [sum(q + k for q in range(p)), sum(10.0 * (q + 1) + k for q in range(p))]
    for got in spawn(_mixed, p, env=TCP):
        assert got == want
