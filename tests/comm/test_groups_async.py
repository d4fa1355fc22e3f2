"""Sub-groups, non-members, async operations in flight from one and several threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import unison as un
from unison.testing import spawn

pytestmark = pytest.mark.timeout(90)


def _groups() -> None:
    r = un.rank()
    even = un.new_group([0, 2])
    odd = un.new_group([1, 3])
    solo = un.new_group([3])
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    x = np.full(10, r, np.int64)
    un.all_reduce(x, group=mine)
    assert (x == (2 if r % 2 == 0 else 4)).all()
    b = np.full(3, r, np.int32)
    un.broadcast(b, src=2 if r % 2 == 0 else 3, group=mine)  # src is a global rank
    assert (b == (2 if r % 2 == 0 else 3)).all()
    with pytest.raises(un.InvalidArgumentError, match="not a member"):
        un.all_reduce(np.zeros(1), group=other)
    with pytest.raises(un.InvalidArgumentError, match="not a rank of group"):
        un.broadcast(np.zeros(1), src=1 if r % 2 == 0 else 0, group=mine)
    if r == 3:
        y = np.ones(4)
        un.all_reduce(y, group=solo)
        assert (y == 1).all()
    un.barrier()
    outs = [np.empty(1, np.int64) for _ in range(2)]
    un.all_gather(outs, np.array([r]), group=mine)
    assert [int(o[0]) for o in outs] == ([0, 2] if r % 2 == 0 else [1, 3])


def test_subgroups_and_non_members() -> None:
    spawn(_groups, 4)


def _async_in_order() -> None:
    r, p = un.rank(), un.size()
    bufs = [np.full(50_000, r + i, np.float64) for i in range(12)]
    works = [un.all_reduce(b, async_op=True) for b in bufs]
    works.append(un.barrier(async_op=True))
    for w in works:
        w.wait(timeout=30)
    for i, b in enumerate(bufs):
        assert (b == sum(k + i for k in range(p))).all()


def test_many_async_operations_complete_in_issue_order() -> None:
    spawn(_async_in_order, 3)


def _threads() -> None:
    r = un.rank()
    g1 = un.new_group([0, 1, 2])
    g2 = un.new_group([0, 1, 2])
    errors: list[BaseException] = []

    def worker(g: un.Group, base: int) -> None:
        try:
            for i in range(30):
                x = np.full(1000, base + i + r, np.int64)
                un.all_reduce(x, group=g)
                assert (x == 3 * (base + i) + 3).all()
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(g, b)) for g, b in ((g1, 0), (g2, 1000))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


def test_concurrent_threads_on_different_groups() -> None:
    spawn(_threads, 3)


def _work_api() -> None:
    x = np.ones(10)
    w = un.all_reduce(x, async_op=True)
    assert isinstance(w, un.Work)
    assert w.wait() is True and w.is_completed() and w.exception() is None
    if un.rank() == 1:
        import time

        time.sleep(1.5)
    w = un.all_reduce(np.ones(10), async_op=True)
    if un.rank() == 0:
        assert not w.is_completed()
        with pytest.raises(un.CollectiveTimeoutError):
            w.wait(timeout=0.2)
        assert isinstance(TimeoutError(), TimeoutError)
    w.wait()


def test_work_wait_timeout_and_is_completed() -> None:
    spawn(_work_api, 2)


def _objects() -> None:
    r = un.rank()
    assert un.broadcast_object({"a": [1, 2]} if r == 1 else None, src=1) == {"a": [1, 2]}
    assert un.all_gather_object(("x" * r, r)) == [("x" * k, k) for k in range(3)]
    got = un.gather_object(r * 1.5, dst=2)
    assert got == ([0.0, 1.5, 3.0] if r == 2 else None)
    assert un.scatter_object([f"to {k}" for k in range(3)] if r == 0 else None, src=0) == f"to {r}"


def test_object_collectives() -> None:
    spawn(_objects, 3)
