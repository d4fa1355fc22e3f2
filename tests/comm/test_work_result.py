"""``Work.result()`` is torch's: the list of the operation's output buffers (the very
objects passed in), checked against a numpy oracle on real ranks."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison.testing import spawn

pytestmark = pytest.mark.timeout(90)


def _results() -> None:
    r, n = un.rank(), un.size()
    x = np.full(3, r + 1.0, np.float32)
    (out,) = un.all_reduce(x, async_op=True).result()
    assert out is x and np.array_equal(out, np.full(3, sum(range(1, n + 1)), np.float32))
    b = np.full(2, float(r), np.float64)
    assert un.broadcast(b, 1, async_op=True).result()[0] is b and (b == 1.0).all()
    blocks = [np.zeros(3, np.float32) for _ in range(n)]
    got = un.all_gather(blocks, np.full(3, float(r), np.float32), async_op=True).result()
    assert len(got) == n and all(g is o for g, o in zip(got, blocks, strict=True))
    assert [float(g[0]) for g in got] == [float(k) for k in range(n)]
    flat = np.zeros(3 * n, np.float32)
    (whole,) = un.all_gather_into_tensor(
        flat, np.full(3, float(r), np.float32), async_op=True
    ).result()
    assert whole is flat and np.array_equal(flat, np.repeat(np.arange(n, dtype=np.float32), 3))
    part = np.zeros(2, np.float32)
    (mine,) = un.reduce_scatter_tensor(part, np.ones(2 * n, np.float32), async_op=True).result()
    assert mine is part and (part == n).all()
    gathered = [np.zeros(1, np.int64) for _ in range(n)] if r == 0 else None
    res = un.gather(np.array([r * 10]), gathered, 0, async_op=True).result()
    assert [int(g[0]) for g in res] == ([10 * k for k in range(n)] if r == 0 else [])
    assert un.barrier(async_op=True).result() == []
    buf = np.zeros(4, np.int32)
    if r == 0:
        sent = np.arange(4, dtype=np.int32)
        assert un.isend(sent, 1).result()[0] is sent
    elif r == 1:
        (got_buf,) = un.irecv(buf, 0).result()
        assert got_buf is buf and np.array_equal(buf, np.arange(4, dtype=np.int32))
    un.barrier()


def test_work_result_lists_the_output_buffers() -> None:
    spawn(_results, 3)
