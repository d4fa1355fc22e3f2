"""unison.tensorflow without torch (run by test_framework_neutral.py under ``unison
run`` with torch refused): eager and ``tf.function`` collectives, bfloat16 included,
checked against numpy; prints one line ``ok <rank>``."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import unison.tensorflow as hvd


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    every = range(n)
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1))
    want = np.arange(6, dtype=np.float32).reshape(2, 3) * sum(k + 1 for k in every)
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum).numpy(), want)
    np.testing.assert_allclose(hvd.allreduce(x).numpy(), want / n, rtol=1e-6)

    @tf.function
    def step(t: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(t, op=hvd.Sum, name="in_graph")

    for _ in range(3):
        np.testing.assert_array_equal(step(x).numpy(), want)
    # bfloat16 travels as 16-bit storage: broadcast and allgather move it exactly
    h = tf.constant([1.5, -2.25, 3.0], tf.bfloat16) * (r + 1)
    got = hvd.broadcast(h, 0).numpy().astype(np.float32)
    np.testing.assert_array_equal(got, np.array([1.5, -2.25, 3.0], np.float32))
    g = hvd.allgather(tf.fill([r + 1, 2], tf.constant(r, tf.int64))).numpy()
    np.testing.assert_array_equal(g, np.concatenate([np.full((k + 1, 2), k) for k in every]))
    # a scalar stays a scalar (a variable assigned from it keeps its shape)
    v = tf.Variable(float(r + 1))
    hvd.broadcast_variables([v], 1)
    assert v.shape == () and float(v.numpy()) == 2.0, v
    assert hvd.allreduce(tf.constant(r + 1), op=hvd.Sum).shape == ()
    assert hvd.broadcast_object({"r": r}, 0) == {"r": 0}
    hvd.shutdown()
    print(f"ok {r}", flush=True)


if __name__ == "__main__":
    main()
