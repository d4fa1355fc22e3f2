"""The engine on numpy buffers alone (run by test_framework_neutral.py under
``unison run``, with torch, tensorflow, jax and keras refused): every kind of
operation, checked against numpy; prints one line ``ok <rank>``."""

from __future__ import annotations

import numpy as np

from unison.buffers import Buffer, DType
from unison.horovod import basics as hvd
from unison.horovod import ops
from unison.horovod.functions import allgather_object, broadcast_object


def _run(h: ops.Handle) -> np.ndarray:
    return ops.to_numpy(ops.synchronize(h))


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    every = range(n)

    # sums and averages, large (a data collective) and small (carried in the message)
    for count in (5, 100_000):
        x = (np.arange(count, dtype=np.float64) % 97) * (r + 1)
        got = _run(ops.allreduce_async(x, op=ops.Sum, name=f"sum{count}"))
        want = sum((np.arange(count, dtype=np.float64) % 97) * (k + 1) for k in every)
        np.testing.assert_array_equal(got, want)
        # Average of integers: truncated toward zero, after the prescale
        i = np.array([-7, 7, 5, -1], np.int32) * (r + 1)
        got = _run(ops.allreduce_async(i, name=f"avg{count}", prescale_factor=3.0))
        total = sum(np.array([-7, 7, 5, -1], np.int64) * (k + 1) * 3 for k in every)
        np.testing.assert_array_equal(got, np.trunc(total / n).astype(np.int32))
    # bfloat16 (int16 storage): reduced in rank order with numpy alone
    f = np.array([1.5, -2.25, 3.0, 0.0], np.float32) * (r + 1)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    got = ops.synchronize(ops.allreduce_async(Buffer(bits, DType.BFLOAT16, bits), op=ops.Sum))
    back = (got.array.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    tri = sum(k + 1 for k in every)
    np.testing.assert_array_equal(back, np.array([1.5, -2.25, 3.0, 0.0], np.float32) * tri)
    # a grouped (fused) float32 allreduce with a postscale, in place
    a = np.full(3, r + 1, np.float32)
    b = np.arange(4, dtype=np.float32) + r
    ops.synchronize(
        ops.grouped_allreduce_async_([a, b], op=ops.Sum, postscale_factor=0.5, name="g")
    )
    np.testing.assert_array_equal(a, np.full(3, sum(k + 1 for k in every) * 0.5, np.float32))
    want_b = sum(np.arange(4, dtype=np.float32) + k for k in every) * np.float32(0.5)
    np.testing.assert_array_equal(b, want_b)
    # allgather with a different first dimension on every rank
    mine = np.full((r + 1, 2), r, np.int64)
    got = _run(ops.allgather_async(mine, name="ag"))
    np.testing.assert_array_equal(got, np.concatenate([np.full((k + 1, 2), k) for k in every]))
    # broadcast from the last rank, into a new buffer and in place
    v = np.arange(7, dtype=np.int16) * (r + 1)
    np.testing.assert_array_equal(
        _run(ops.broadcast_async(v, n - 1, name="bc")), np.arange(7, dtype=np.int16) * n
    )
    ops.synchronize(ops.broadcast_async_(v, 0, name="bc_"))
    np.testing.assert_array_equal(v, np.arange(7, dtype=np.int16))
    # alltoall: rank r sends j + 1 rows to rank j
    rows = sum(j + 1 for j in every)
    t = np.full((rows, 3), r, np.float32)
    out, received = ops.synchronize(ops.alltoall_async(t, [j + 1 for j in every], name="a2a"))
    np.testing.assert_array_equal(received, np.full(n, r + 1, np.int32))
    np.testing.assert_array_equal(
        ops.to_numpy(out), np.concatenate([np.full((r + 1, 3), k, np.float32) for k in every])
    )
    # reducescatter: rank i keeps the i-th block of rows of the sum
    m = np.arange(2 * n + 1, dtype=np.float64).reshape(-1, 1) * (r + 1)
    got = _run(ops.reducescatter_async(m, op=ops.Sum, name="rs"))
    full = np.arange(2 * n + 1, dtype=np.float64).reshape(-1, 1) * sum(k + 1 for k in every)
    extra = (2 * n + 1) % n
    start = sum(2 + (1 if k < extra else 0) for k in range(r))
    np.testing.assert_array_equal(got, full[start : start + 2 + (1 if r < extra else 0)])
    # Python objects, and a barrier
    assert broadcast_object({"from": r}, 0) == {"from": 0}
    assert allgather_object(r * 10) == [k * 10 for k in every]
    ops.barrier()
    hvd.shutdown()
    print(f"ok {r}", flush=True)


if __name__ == "__main__":
    main()
