"""The TensorFlow front's result pool (unison/tensorflow/results.py): results are
TensorFlow's view of the pool's memory, handed out again only once nothing refers to it.
Each check runs in a child process: TensorFlow set up in the test process would be
inherited by the jobs that later tests fork from it."""

from __future__ import annotations

import gc
import importlib.util

import numpy as np
import pytest

from unison.testing import spawn

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="needs the [tensorflow] extra"
    ),
    pytest.mark.timeout(120),
]


def _address(t: object) -> int:
    from unison.tensorflow._bridge import values_of

    return int(values_of(t).ctypes.data)


def _reuse_only_when_free() -> None:
    import tensorflow as tf

    from unison.buffers import DType
    from unison.tensorflow.results import ALIGN, ResultPool

    pool = ResultPool()
    b = pool.take(DType.FLOAT32, (4, 256))
    assert b.array.ctypes.data % ALIGN == 0
    b.array[:] = 1.0
    t = pool.tensor(b, tf.float32)
    b.array[0] = 7.0  # no copy: the tensor is the pool's memory
    assert float(t[0, 0]) == 7.0 and _address(t) == b.array.ctypes.data
    first = b.array.ctypes.data
    del b
    gc.collect()
    held = pool.take(DType.FLOAT32, (4, 256))  # the tensor still holds the first block
    assert held.array.ctypes.data != first
    held.array[:] = 2.0
    assert float(t[0, 0]) == 7.0 and float(t[1, 0]) == 1.0
    u = tf.reshape(t, [-1])  # a tensor derived from the result holds it as well
    del t
    gc.collect()
    other = pool.take(DType.FLOAT32, (4, 256))
    assert other.array.ctypes.data not in (first, held.array.ctypes.data)
    assert float(u[0]) == 7.0
    del u, held, other
    gc.collect()
    again = pool.take(DType.FLOAT32, (4, 256))  # every block is free: the first comes back
    assert again.array.ctypes.data == first
    # each of these is dropped at once: one free block serves them all
    reused = {pool.take(DType.FLOAT32, (4, 256)).array.ctypes.data for _ in range(5)}
    assert len(reused) == 1 and first not in reused, reused


def _others_copied() -> None:
    import tensorflow as tf

    from unison.buffers import Buffer, DType
    from unison.tensorflow.results import ResultPool

    pool = ResultPool()
    a = np.ones(64, np.float32)
    t = pool.tensor(Buffer(a, DType.FLOAT32, a), tf.float32)
    a[0] = 5.0
    assert float(t[0]) == 1.0
    bf = pool.take(DType.BFLOAT16, (8,))  # no numpy bfloat16 for DLPack: copied
    bf.array[:] = np.float32(3.0).view(np.int32) >> 16
    t16 = pool.tensor(bf, tf.bfloat16)
    bf.array[:] = 0
    assert float(tf.cast(t16, tf.float32)[0]) == 3.0


def test_results_share_memory_and_are_reused_only_when_free() -> None:
    spawn(_reuse_only_when_free, 1, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=100)


def test_results_the_pool_does_not_own_are_copied() -> None:
    spawn(_others_copied, 1, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=100)
