"""Horovod's TensorFlow semantics, checked on every rank of one job (TF imports are slow):
each check returns None when it holds, or what went wrong (so one broken check does not
hide the others). Values are checked against numpy."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np


def graph_any_order(hvd: Any) -> None:
    """A tf.compat.v1 graph of many independent collectives, made in opposite orders on
    the two ranks (so TF's executor readies them in opposite orders), runs to the end."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    count = 2 * (os.cpu_count() or 2) + 16
    order = range(count) if r % 2 == 0 else reversed(range(count))
    with tf.Graph().as_default():
        outs: dict[int, Any] = {}
        for i in order:
            x = tf.fill([n * 2, 3], tf.constant(float(i + r), tf.float32))
            if i % 3 == 0:
                outs[i] = hvd.reducescatter(x, op=hvd.Sum, name=f"order.rs.{i}")
            elif i % 3 == 1:
                outs[i] = hvd.allreduce(x, op=hvd.Sum, name=f"order.ar.{i}")
            else:
                sl = tf.IndexedSlices(x[:1], tf.constant([r]), tf.constant([n * 2, 3]))
                outs[i] = hvd.grouped_allreduce([sl, x], op=hvd.Sum, name=f"order.g.{i}")[1]
        with tf.compat.v1.Session() as sess:
            got = sess.run({i: outs[i] for i in range(count)})
    for i in range(count):
        want = sum(float(i + k) for k in range(n))
        rows = 2 if i % 3 == 0 else n * 2
        assert got[i].shape == (rows, 3), (i, got[i].shape)
        assert np.allclose(got[i], want), (i, got[i], want)


def _raises(kind: Any, fn: Callable[[], Any], what: str) -> None:
    try:
        fn()
    except kind:
        return
    except Exception as e:
        raise AssertionError(f"{what}: {type(e).__name__} instead of {kind.__name__}: {e}") from e
    raise AssertionError(f"{what}: no error")


def error_types(hvd: Any) -> None:
    """A shape mismatch is FailedPreconditionError eagerly, in a tf.function and in a
    Session; alltoall's split errors are InvalidArgumentError."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    fpe, iae = tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError
    _raises(fpe, lambda: hvd.allreduce(tf.ones([3 + r])), "eager allreduce")
    _raises(fpe, lambda: tf.function(hvd.allgather)(tf.ones([2, 3 + r])), "tf.function allgather")
    with tf.Graph().as_default():
        bad = hvd.allreduce(tf.ones([5 + r]), name="mismatch.session")
        with tf.compat.v1.Session() as sess:
            try:
                sess.run(bad)
            except fpe as e:
                assert "mismatch.session" in str(e), str(e)  # the engine's own message
            else:
                raise AssertionError("Session allreduce: no error")
    too_many = tf.fill([n], 9)
    _raises(iae, lambda: hvd.alltoall(tf.ones([5]), splits=too_many), "eager alltoall splits")
    _raises(iae, lambda: hvd.alltoall(tf.ones([2 * n + 1])), "eager alltoall uneven")
    with tf.Graph().as_default():
        op = hvd.alltoall(tf.ones([5]), splits=[9] * n)
        with tf.compat.v1.Session() as sess:
            _raises(iae, lambda: sess.run(op), "Session alltoall splits")


def alltoall_returns(hvd: Any) -> None:
    """Without splits alltoall returns the received tensor; with splits the tensor and
    the received splits."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    out = hvd.alltoall(tf.fill([n, 2], r))
    assert isinstance(out, tf.Tensor), type(out)
    assert np.array_equal(out.numpy(), np.repeat(np.arange(n), 2).reshape(n, 2))
    pair = hvd.alltoall(tf.fill([n * (r + 1)], r), splits=tf.fill([n], r + 1))
    assert isinstance(pair, tuple) and len(pair) == 2, type(pair)
    got, recv = pair
    assert list(recv.numpy()) == [k + 1 for k in range(n)], recv
    assert list(got.numpy()) == [k for k in range(n) for _ in range(k + 1)], got


def moved_dtypes(hvd: Any) -> None:
    """uint16 (like every dtype Horovod moves) allgathers, broadcasts and alltoalls,
    eagerly and in a tf.function, bit for bit."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    for dt in (tf.uint16, tf.uint8, tf.int16, tf.bool):
        npdt = dt.as_numpy_dtype
        top = 1 if dt == tf.bool else 60000 if dt == tf.uint16 else 100
        mine = (np.arange(2 * (r + 1)).reshape(r + 1, 2) + top - 1) % (top + 1)
        mine = mine.astype(npdt)
        for mode in ("eager", "function"):

            def run(x: Any) -> Any:
                return (
                    hvd.allgather(x),
                    hvd.broadcast(x[:1], n - 1),
                    hvd.alltoall(tf.concat([x[:1]] * n, 0)),
                )

            f = run if mode == "eager" else tf.function(run)
            ag, bc, a2a = f(tf.constant(mine))
            parts = [
                ((np.arange(2 * (k + 1)).reshape(k + 1, 2) + top - 1) % (top + 1)).astype(npdt)
                for k in range(n)
            ]
            assert ag.dtype == dt and np.array_equal(ag.numpy(), np.concatenate(parts)), (dt, mode)
            assert np.array_equal(bc.numpy(), parts[n - 1][:1]), (dt, mode, bc)
            assert np.array_equal(a2a.numpy(), np.concatenate([p[:1] for p in parts])), (dt, mode)


def gradients(hvd: Any) -> None:
    """Horovod's registered gradients: Sum reducescatter's scaled by the set's size;
    allgather's and broadcast's averaged over the ranks."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    c = float(r + 1)
    mean_c = (n + 1) / 2

    def grad(fn: Any, x0: Any) -> np.ndarray:
        x = tf.constant(x0, tf.float64)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(fn(x))
        return tape.gradient(loss, x).numpy()

    g = grad(lambda t: hvd.reducescatter(t, op=hvd.Sum) * c, np.ones((n, 1)))
    assert np.allclose(g[:, 0], np.arange(1, n + 1) * n), ("reducescatter", g)
    g = grad(lambda t: hvd.allgather(t) * c, np.ones((r + 1, 1)))
    assert np.allclose(g, mean_c), ("allgather", g)
    g = grad(lambda t: hvd.broadcast(t, 0) * c, np.ones(3))
    assert np.allclose(g, mean_c if r == 0 else 0.0), ("broadcast", g)
    # grouped ops with an unused output: its zero gradient may come as float32
    g = grad(lambda t: hvd.grouped_allgather([t, t * 2.0])[0] * c, np.ones((r + 1, 1)))
    assert np.allclose(g, mean_c), ("grouped allgather, one output used", g)
    g = grad(lambda t: hvd.grouped_reducescatter([t, t], op=hvd.Sum)[0] * c, np.ones((n, 1)))
    assert np.allclose(g[:, 0], np.arange(1, n + 1) * n), ("grouped reducescatter", g)


def missing_pieces(hvd: Any) -> None:
    """Horovod's names scripts and tests reach: hvd._executing_eagerly, hvd.util,
    prescale with IndexedSlices, an unregistered set, a set without this rank."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    assert hvd._executing_eagerly() is True
    assert hvd.util._executing_eagerly() is True
    v = tf.Variable([1.0])
    assert hvd.util.refs_to_vars(hvd.util.vars_to_refs([v]))[0] is v
    with tf.Graph().as_default():
        assert hvd._executing_eagerly() is False
    sl = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([2, 2]))
    _raises(NotImplementedError, lambda: hvd.allreduce(sl, prescale_factor=2.0), "prescale")
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 1000
    _raises(ValueError, lambda: hvd.allreduce(tf.ones([2]), process_set=fake), "unregistered")
    # a tape over a set without this rank gives this rank's own gradient, as Horovod's
    x = tf.constant(float(r))
    with tf.GradientTape() as g:
        g.watch(x)
        y = x * x
    only0 = hvd.add_process_set([0])
    try:
        (dx,) = hvd.DistributedGradientTape(g, process_set=only0).gradient(y, [x])
        assert np.isclose(float(dx), 0.0 if r == 0 else 2.0 * r), dx
    finally:
        hvd.remove_process_set(only0)
    _ = n


def local_sources(hvd: Any) -> None:
    """register_local_source / PartialDistributedGradientTape: a local source keeps this
    rank's gradient (divided by the set's size), the others are averaged."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    dense = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    dense.build((None, 1))
    w = tf.Variable([1.0])
    x = tf.constant([[float(r + 1)]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dense(x)) + tf.reduce_sum(w * (r + 1))
    t = hvd.PartialDistributedGradientTape(tape, local_layers=[dense])
    gk, gw = t.gradient(loss, [dense.kernel, w])
    assert np.isclose(float(tf.reshape(gk, [-1])[0]), (r + 1) / n), gk
    assert np.isclose(float(gw[0]), (n + 1) / 2), gw
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * (r + 1))
    t = hvd.DistributedGradientTape(tape, scale_local_gradients=False)
    t.register_local_source(w)
    local, shared = t.get_local_and_global_gradients(loss, [w])
    assert not shared and np.isclose(float(local[0][1][0]), r + 1), (local, shared)


def sync_batch_norm(hvd: Any) -> None:
    """SyncBatchNormalization normalizes with the statistics of every rank's batch."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    every = [np.array([[k, k + 1.0], [2.0 * k, 2.0 * k + 3]], np.float32) for k in range(n)]
    allx = np.concatenate(every)
    mean, var = allx.mean(0), allx.var(0)
    bn = hvd.SyncBatchNormalization(axis=1, epsilon=1e-3)
    out = bn(tf.constant(every[r]), training=True).numpy()
    want = (every[r] - mean) / np.sqrt(var + 1e-3)
    assert np.allclose(out, want, atol=1e-4), (out, want)
    _raises(ValueError, lambda: hvd.SyncBatchNormalization(fused=True), "fused=True")


def legacy_optimizer(hvd: Any) -> None:
    """DistributedOptimizer wraps a tf.compat.v1.train.Optimizer: its compute_gradients
    averages the gradients over the ranks (a tf.compat.v1 graph)."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("legacy_w", initializer=tf.constant([1.0]))
        loss = tf.reduce_sum(v * float(r + 1))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        assert isinstance(opt, tf.compat.v1.train.Optimizer), type(opt)
        step = opt.minimize(loss, var_list=[v])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step)
            got = sess.run(v)
    assert np.allclose(got, 1.0 - 0.5 * (n + 1) / 2), got


def keras_local(hvd: Any) -> None:
    """unison.tensorflow.keras: PartialDistributedOptimizer keeps a local layer's
    gradient; BroadcastGlobalVariablesCallback(local_variables=) leaves them alone."""
    import tensorflow as tf

    import unison.tensorflow.keras as hk

    r, n = hvd.rank(), hvd.size()
    inp = tf.keras.Input((1,))
    shared = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    local = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = tf.keras.Model(inp, local(shared(inp)))
    opt = hk.PartialDistributedOptimizer(
        tf.keras.optimizers.SGD(0.1), local_layers=[local], scale_local_gradients=False
    )
    model.compile(opt, loss="mae")
    x = np.full((2, 1), float(r + 1), np.float32)
    y = np.full((2, 1), -100.0, np.float32)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    # d(mae)/d(out) = 1; d/d(local) = shared out = r+1 (own); d/d(shared) = x*local = r+1
    got_local = float(np.asarray(local.kernel).reshape(-1)[0])
    got_shared = float(np.asarray(shared.kernel).reshape(-1)[0])
    assert np.isclose(got_local, 1.0 - 0.1 * (r + 1)), got_local
    assert np.isclose(got_shared, 1.0 - 0.1 * (n + 1) / 2), got_shared
    # the callback: local ones keep each rank's value, the others become rank 0's
    inp = tf.keras.Input((1,))
    a = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    b = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    m = tf.keras.Model(inp, b(a(inp)))
    a.kernel.assign([[float(r + 5)]])
    b.kernel.assign([[float(r + 7)]])
    cb = hk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[b.kernel])
    cb.set_model(m)
    cb.on_batch_end(0)
    assert float(np.asarray(a.kernel)[0, 0]) == 5.0, a.kernel
    assert float(np.asarray(b.kernel)[0, 0]) == r + 7.0, b.kernel


def broadcast_inplace(hvd: Any) -> None:
    """``broadcast_`` as Horovod's: it returns the variables' values read after the
    broadcast (tensors, not the variables). In a tf.compat.v1 graph evaluating those
    values runs the broadcast, for resource and reference variables alike, and leaves
    the variables holding the root's values; eagerly it has run already."""
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    try:  # where TF keeps the reference variable (Horovod's test imports it the same way)
        from tensorflow.python.ops.variables import RefVariable
    except ImportError:
        from tensorflow.python.ops.ref_variable import RefVariable

    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        for dtype in (tf.float32, tf.int32, tf.bool):
            start = np.full((3, 4), r % 2 if dtype == tf.bool else r + 1)
            want = np.full((3, 4), root % 2 if dtype == tf.bool else root + 1)
            want = want.astype(dtype.as_numpy_dtype)
            v = tf.Variable(tf.cast(start, dtype))
            (out,) = hvd.broadcast_([v], root)
            assert isinstance(out, tf.Tensor), f"eager broadcast_ returned {type(out)}"
            assert np.array_equal(out.numpy(), want), (root, dtype, out.numpy())
            assert np.array_equal(v.numpy(), want), (root, dtype, v.numpy())
            for make in (resource_variable_ops.ResourceVariable, RefVariable):
                with tf.Graph().as_default():
                    gv = make(tf.cast(start, dtype))
                    (gout,) = hvd.broadcast_([gv], root)
                    assert isinstance(gout, tf.Tensor), (make.__name__, type(gout))
                    with tf.compat.v1.Session() as sess:
                        sess.run(tf.compat.v1.global_variables_initializer())
                        got = sess.run(gout)
                        held = sess.run(gv)
                    what = (make.__name__, root, dtype.name)
                    assert np.array_equal(got, want), (*what, "value", got)
                    assert np.array_equal(held, want), (*what, "variable", held)


CHECKS: dict[str, Callable[[Any], None]] = {
    "graph_any_order": graph_any_order,
    "error_types": error_types,
    "alltoall_returns": alltoall_returns,
    "moved_dtypes": moved_dtypes,
    "gradients": gradients,
    "missing_pieces": missing_pieces,
    "local_sources": local_sources,
    "sync_batch_norm": sync_batch_norm,
    "legacy_optimizer": legacy_optimizer,
    "keras_local": keras_local,
    "broadcast_inplace": broadcast_inplace,
}


def semantics_job(names: list[str]) -> dict[str, str | None]:
    """Run the named checks on this rank: name -> None (holds) or the failure."""
    import tensorflow as tf

    import unison.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    out: dict[str, str | None] = {}
    try:
        for name in names:
            try:
                CHECKS[name](hvd)
                out[name] = None
            except BaseException:
                out[name] = traceback.format_exc(limit=6)
        return out
    finally:
        hvd.shutdown()


def keras2_fit(hvd: Any) -> None:
    """On tf_keras (TF_USE_LEGACY_KERAS=1): DistributedOptimizer wraps Keras 2's
    optimizers (current and legacy) and Model.fit with the callbacks averages."""
    import tensorflow as tf

    import unison.tensorflow.keras as hk

    r, n = hvd.rank(), hvd.size()
    assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
    for make in (lambda: tf.keras.optimizers.SGD(0.1), lambda: tf.keras.optimizers.legacy.SGD(0.1)):
        inp = tf.keras.Input((1,))
        layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        model = tf.keras.Model(inp, layer(inp))
        model.compile(hk.DistributedOptimizer(make()), loss="mae")
        x = np.full((2, 1), float(r + 1), np.float32)
        y = np.full((2, 1), -100.0, np.float32)
        cbs = [
            hk.callbacks.BroadcastGlobalVariablesCallback(0),
            hk.callbacks.MetricAverageCallback(),
        ]
        hist = model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=cbs)
        got = float(np.asarray(layer.kernel).reshape(-1)[0])
        assert np.isclose(got, 1.0 - 0.1 * (n + 1) / 2), got
        mean_loss = np.mean([100.0 + k + 1 for k in range(n)])
        assert np.isclose(hist.history["loss"][0], mean_loss), hist.history


CHECKS["keras2_fit"] = keras2_fit


def keras2_through_keras(hvd: Any) -> None:
    """On tf_keras: ``unison.keras.PartialDistributedOptimizer`` (Horovod's
    ``horovod.keras``) takes tf_keras' optimizer and layers; its ``_compute_gradients``
    and ``compute_gradients`` return the shared weights' gradients averaged over the
    workers and the local layer's own gradients divided by the size (Horovod's scaling)."""
    import tensorflow as tf

    import unison.keras as hk

    r, n = hvd.rank(), hvd.size()
    inp = tf.keras.Input((2,))
    local = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    shared = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = tf.keras.Model(inp, shared(local(inp)))
    x = np.full((1, 2), float(r + 1), np.float32)
    opt = hk.PartialDistributedOptimizer(tf.keras.optimizers.SGD(0.1), local_layers=[local])
    # loss = sum(model(x)) = 2 (r+1) w_local w_shared; d/dw_local = (r+1) w_shared per entry
    want_local = np.full((2, 1), (r + 1) / n, np.float32)
    want_shared = np.full((1, 1), np.mean([2.0 * (k + 1) for k in range(n)]), np.float32)
    for compute in ("_compute_gradients", "compute_gradients"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        pairs = getattr(opt, compute)(loss, model.trainable_weights, tape=tape)
        got = {id(v): np.asarray(g) for g, v in pairs}
        assert np.allclose(got[id(local.kernel)], want_local), (compute, got)
        assert np.allclose(got[id(shared.kernel)], want_shared), (compute, got)


def keras2_elastic_state(hvd: Any) -> None:
    """On tf_keras: ``KerasState`` syncs, restores and commits a tf_keras model (whose
    variables' ``value`` is a method)."""
    import tensorflow as tf

    import unison.tensorflow.keras as hk

    r = hvd.rank()
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    model.build((1, 2))
    model.set_weights([np.full((2, 2), r + 1.0, np.float32), np.full(2, r + 1.0, np.float32)])
    state = hk.elastic.KerasState(model, tf.keras.optimizers.Adam(0.01), epoch=r)
    state.sync()
    assert state.epoch == 0, state.epoch
    assert all(np.allclose(w, 1.0) for w in model.get_weights()), model.get_weights()
    model.set_weights([np.full((2, 2), 7.0, np.float32), np.full(2, 7.0, np.float32)])
    state.restore()
    assert all(np.allclose(w, 1.0) for w in model.get_weights()), model.get_weights()
    model.set_weights([np.full((2, 2), 5.0, np.float32), np.full(2, 5.0, np.float32)])
    state.commit()
    model.set_weights([np.full((2, 2), 9.0, np.float32), np.full(2, 9.0, np.float32)])
    state.restore()
    assert all(np.allclose(w, 5.0) for w in model.get_weights()), model.get_weights()


CHECKS["keras2_through_keras"] = keras2_through_keras
CHECKS["keras2_elastic_state"] = keras2_elastic_state


def _aggregation_oracle(
    grads: list[list[np.ndarray]], passes: int, average: bool, lr: float, start: np.ndarray
) -> list[np.ndarray]:
    """Horovod's plain SGD with ``backward_passes_per_step``: the value after each pass
    when ``grads[p][r]`` is rank r's gradient on pass p (summed over a step's passes,
    averaged over the ranks, divided by the passes where ``average``)."""
    value, total, out = start.astype(np.float64), np.zeros_like(start, np.float64), []
    for p, per_rank in enumerate(grads):
        total = total + np.mean(per_rank, axis=0)
        if (p + 1) % passes == 0:
            value = value - lr * (total / passes if average else total)
            total = np.zeros_like(total)
        out.append(value.copy())
    return out


def _aggregation_passes(
    hvd: Any, make: Callable[[float], Any], average: bool, traced: bool
) -> None:
    """Seven passes of one optimizer made by ``make(learning_rate)`` with
    ``backward_passes_per_step=3`` on a shared ``w`` and a local ``u``, checked after each
    pass against the oracle."""
    import tensorflow as tf

    import unison.tensorflow.keras as hk

    r, n = hvd.rank(), hvd.size()
    lr, passes, count = 0.5, 3, 7
    opt = hk.DistributedOptimizer(
        make(lr), backward_passes_per_step=passes, average_aggregated_gradients=average
    )
    w = tf.Variable([1.0, -2.0])
    u = tf.Variable([3.0])
    opt.register_local_var(u)
    step = tf.Variable(0.0)

    def loss() -> Any:
        p = step + 1.0  # this pass, from 1
        c = tf.stack([(r + 1.0) * p, tf.constant(1.0)])
        return tf.reduce_sum(w * c) + tf.reduce_sum(u) * ((r + 1.0) + p)

    def one_pass() -> None:
        pairs = opt.compute_gradients(loss, [w, u])
        opt.apply_gradients(pairs)
        step.assign_add(1.0)

    run = tf.function(one_pass) if traced else one_pass
    gw = [[np.array([(k + 1.0) * (p + 1), 1.0]) for k in range(n)] for p in range(count)]
    gu = [[np.array([((r + 1.0) + (p + 1)) / n])] for p in range(count)]
    want_w = _aggregation_oracle(gw, passes, average, lr, np.array([1.0, -2.0]))
    want_u = _aggregation_oracle(gu, passes, average, lr, np.array([3.0]))
    for p in range(count):
        run()
        what = (type(opt).__module__, average, traced, p)
        assert np.allclose(w.numpy(), want_w[p]), (what, w.numpy(), want_w[p])
        assert np.allclose(u.numpy(), want_u[p]), (what, u.numpy(), want_u[p])
        assert int(opt.iterations.numpy()) == p + 1, (what, opt.iterations.numpy())


def keras2_aggregation(hvd: Any) -> None:
    """On tf_keras: ``DistributedOptimizer(backward_passes_per_step=N)`` sums N passes'
    gradients locally, averages the sum over the workers (divided by N with
    ``average_aggregated_gradients``) and updates the variables on every Nth pass only,
    while ``iterations`` counts every pass; eagerly and inside ``tf.function``, for the
    current and the legacy optimizers, and in ``Model.fit``. A registered local variable
    takes its own sum divided by the size. Values against a numpy oracle."""
    import tensorflow as tf

    import unison.tensorflow.keras as hk

    r, n = hvd.rank(), hvd.size()
    for make in (tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD):
        for average in (False, True):
            for traced in (False, True):
                _aggregation_passes(hvd, make, average, traced)
    # Model.fit: batch b of rank r is x = (r + 1) (b + 1) with y far below, so the mae
    # gradient of the kernel is x
    inp = tf.keras.Input((1,))
    layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = tf.keras.Model(inp, layer(inp))
    fit_lr, batches = 0.01, 5
    model.compile(
        hk.DistributedOptimizer(tf.keras.optimizers.SGD(fit_lr), backward_passes_per_step=2),
        loss="mae",
    )
    x = np.array([[(r + 1.0) * (b + 1)] for b in range(batches)], np.float32)
    y = np.full((batches, 1), -1000.0, np.float32)
    seen: list[float] = []
    record = tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: seen.append(float(np.asarray(layer.kernel)[0, 0]))
    )
    model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    gk = [[np.array([(k + 1.0) * (b + 1)]) for k in range(n)] for b in range(batches)]
    want = [float(v[0]) for v in _aggregation_oracle(gk, 2, False, fit_lr, np.array([1.0]))]
    assert np.allclose(seen, want), (seen, want)
    assert int(model.optimizer.iterations.numpy()) == batches, model.optimizer.iterations


CHECKS["keras2_aggregation"] = keras2_aggregation
