# ruff: noqa: B023
"""Checks run on every rank of one TensorFlow job (TF imports are slow: one job, many
checks). Each check asserts against a numpy oracle; a failure names the check."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

DTYPES = [
    "uint8", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "bool",
]  # fmt: skip


def _np(t: Any) -> np.ndarray:
    import tensorflow as tf

    if t.dtype == tf.bfloat16:
        t = tf.cast(t, tf.float32)
    return np.asarray(t.numpy())


def _eq(got: Any, want: Any, what: str) -> None:
    g = _np(got)
    w = np.asarray(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    assert np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-2, atol=1e-2), (
        f"{what}: {g} != {w}"
    )


def _all_ops(hvd: Any, x: Any, rows: Any, mine: Any, bx: Any, src: Any, splits: Any) -> Any:
    """Every collective once (numeric-only ones when ``x`` is given)."""
    n = hvd.size()
    out: dict[str, Any] = {}
    if x is not None:
        out["sum"] = hvd.allreduce(x, op=hvd.Sum)
        out["min"] = hvd.allreduce(x, op=hvd.Min)
        out["max"] = hvd.allreduce(x, op=hvd.Max)
        out["prod"] = hvd.allreduce(x[:1], op=hvd.Product)
        if x.dtype.is_floating:
            out["avg"] = hvd.allreduce(x)
            out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        out["rs"] = hvd.reducescatter(rows, op=hvd.Sum)
        out["grs"] = hvd.grouped_reducescatter([rows, rows], op=hvd.Sum)
        out["g"] = hvd.grouped_allreduce([x, x[:2]], op=hvd.Sum)
    out["ag"] = hvd.allgather(mine)
    out["gag"] = hvd.grouped_allgather([mine, mine[:1]])
    out["bc"] = hvd.broadcast(bx, n - 1)
    out["a2a"] = hvd.alltoall(src, splits=splits)
    return out


def check_ops(hvd: Any) -> int:
    """Every op x dtype x eager/tf.function against numpy (one tf.function per dtype)."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    count = 0
    for mode in ("eager", "graph"):
        for name in DTYPES:
            dt = getattr(tf, name)
            numeric = name != "bool"
            what = f"{mode}/{name}"
            base = np.array([1, 2, 3])
            rows = np.arange((n + 1) * 2).reshape(n + 1, 2) % 7
            mine = np.full((r + 1, 2), r if numeric else r % 2)
            bx = np.arange(4) % 2 + r if numeric else np.arange(4) % 2 == r % 2
            splits = [j + 1 for j in range(n)]
            send = np.concatenate([np.full(j + 1, 10 * r + j) for j in range(n)])
            args = [
                tf.cast(base * (r + 1), dt) if numeric else None,
                tf.cast(rows, dt) if numeric else None,
                tf.cast(mine, dt),
                tf.cast(bx, dt),
                tf.cast(send if numeric else send % 2, dt),
            ]
            fn = lambda *a: _all_ops(hvd, *a, splits)
            o = fn(*args) if mode == "eager" else tf.function(fn)(*args)
            if numeric:
                tri = n * (n + 1) // 2
                _eq(o["sum"], base * tri, f"allreduce sum {what}")
                _eq(o["min"], base, f"allreduce min {what}")
                _eq(o["max"], base * n, f"allreduce max {what}")
                _eq(o["prod"], [np.prod(np.arange(1, n + 1))], f"allreduce product {what}")
                if dt.is_floating:
                    _eq(o["avg"], base * (n + 1) / 2, f"allreduce average {what}")
                    _eq(o["scaled"], base * tri, f"allreduce pre/postscale {what}")
                lo = 0 if r == 0 else r + 1
                block = (rows * n)[lo : lo + (2 if r == 0 else 1)]
                _eq(o["rs"], block, f"reducescatter {what}")
                _eq(o["grs"][1], block, f"grouped reducescatter {what}")
                _eq(o["g"][0], base * tri, f"grouped allreduce {what}")
                _eq(o["g"][1], base[:2] * tri, f"grouped allreduce {what}")
            val = (lambda k: k) if numeric else (lambda k: k % 2)
            want = np.concatenate([np.full((k + 1, 2), val(k)) for k in range(n)])
            _eq(o["ag"], want, f"allgather {what}")
            _eq(o["gag"][1], np.concatenate([np.full((1, 2), val(k)) for k in range(n)]),
                f"grouped allgather {what}")  # fmt: skip
            bw = np.arange(4) % 2 + (n - 1) if numeric else np.arange(4) % 2 == (n - 1) % 2
            _eq(o["bc"], bw, f"broadcast {what}")
            exp = np.concatenate([np.full(r + 1, 10 * k + r) for k in range(n)])
            _eq(o["a2a"][0], exp if numeric else exp % 2, f"alltoall {what}")
            assert list(o["a2a"][1].numpy()) == [r + 1] * n, f"alltoall splits {what}"
            count += 1
    return count


def check_gradients(hvd: Any) -> None:
    """Gradients as Horovod defines them, against hand-computed values."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    c = float(r + 1)
    tri = n * (n + 1) / 2
    for mode in ("eager", "graph"):

        def grad(fn: Any, x0: Any) -> np.ndarray:
            def body(x: Any) -> Any:
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(fn(x))
                return tape.gradient(loss, x)

            f = body if mode == "eager" else tf.function(body)
            return f(tf.constant(x0, tf.float64)).numpy()

        x = np.ones((n, 2))
        g = grad(lambda t: hvd.allreduce(t, op=hvd.Sum) * c, x)
        assert np.allclose(g, tri), (mode, "allreduce sum grad", g)
        g = grad(lambda t: hvd.allreduce(t) * c, x)
        assert np.allclose(g, tri / n), (mode, "allreduce average grad", g)
        # allgather: rank r has r+1 rows; loss weights rows by index, times c
        total = int(tri)
        w = np.arange(total, dtype=np.float64)[:, None]
        g = grad(lambda t: hvd.allgather(t) * w * c, np.ones((r + 1, 1)))
        off = r * (r + 1) // 2
        # Horovod's: the output's gradient averaged over ranks, this rank's rows of it
        assert np.allclose(g, tri / n * w[off : off + r + 1]), (mode, "allgather grad", g)
        # Horovod's: the average over ranks on the root, zeros elsewhere
        g = grad(lambda t: hvd.broadcast(t, 0) * c, x)
        assert np.allclose(g, tri / n if r == 0 else 0.0), (mode, "broadcast grad", g)
        g = grad(lambda t: hvd.alltoall(t) * c, np.ones((n, 1)))
        assert np.allclose(g[:, 0], np.arange(1, n + 1)), (mode, "alltoall grad", g)
        # Horovod's: the gathered gradient, times the set's size for Sum
        g = grad(lambda t: hvd.reducescatter(t, op=hvd.Sum) * c, np.ones((n, 1)))
        assert np.allclose(g[:, 0], np.arange(1, n + 1) * n), (mode, "reducescatter grad", g)
        g = grad(lambda t: hvd.reducescatter(t) * c, np.ones((n, 1)))
        assert np.allclose(g[:, 0], np.arange(1, n + 1)), (mode, "reducescatter avg grad", g)


def check_errors(hvd: Any) -> None:
    """A mismatch raises on every rank, eagerly and inside tf.function."""
    import tensorflow as tf

    r = hvd.rank()
    for bad, msg in (
        (lambda: hvd.allreduce(tf.ones([r + 1]), name="shape"), "shape"),
        (lambda: hvd.allreduce(tf.ones([2], tf.float32 if r else tf.float64), name="dt"), "dtype"),
        (lambda: hvd.broadcast(tf.ones([2]), r, name="root"), "root"),
    ):
        try:
            bad()
        except tf.errors.FailedPreconditionError as e:
            assert "mismatch" in str(e), str(e)
        else:
            raise AssertionError(f"no error for a {msg} mismatch")
    f = tf.function(lambda t: hvd.allgather(t, name="graph_bad"))
    try:
        f(tf.ones([2, r + 1]))
    except tf.errors.OpError as e:
        assert "mismatch" in str(e), str(e)
    else:
        raise AssertionError("no error for a mismatch inside tf.function")
    # the engine still works afterwards
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == hvd.size()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = hvd.allreduce(tf.constant([2.0]), average=False)
    assert float(out[0]) == 2.0 * hvd.size() and any(
        issubclass(x.category, DeprecationWarning) for x in w
    )
    try:
        hvd.allreduce(tf.constant(1.0), op=hvd.Sum, average=True)
    except ValueError:
        pass
    else:
        raise AssertionError("op and average together must raise")


def check_sparse_tape_and_helpers(hvd: Any) -> None:
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    s = tf.IndexedSlices(tf.constant([[float(r)]]), tf.constant([r], tf.int64), [n, 1])
    out = hvd.allreduce(s)
    assert isinstance(out, tf.IndexedSlices)
    assert np.allclose(out.values.numpy()[:, 0], np.arange(n) / n), out.values
    assert list(out.indices.numpy()) == list(range(n))
    # DistributedGradientTape == one process training on the concatenated batch
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4 * n, 3))
    Y = X @ np.array([[1.0], [-2.0], [0.5]]) + 0.1
    w_dist = tf.Variable(np.zeros((3, 1)))
    w_one = tf.Variable(np.zeros((3, 1)))
    emb = tf.Variable(np.ones((n, 2)))

    @tf.function
    def dist_step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w_dist - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        (g,) = tape.gradient(loss, [w_dist])
        w_dist.assign_sub(0.1 * g)

    def one_step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w_one - y) ** 2)
        w_one.assign_sub(0.1 * tape.gradient(loss, w_one))

    for _ in range(5):
        dist_step(X[4 * r : 4 * r + 4], Y[4 * r : 4 * r + 4])
        one_step(X, Y)
    assert np.allclose(w_dist.numpy(), w_one.numpy(), atol=1e-10), (w_dist, w_one)
    # sparse gradients: allgathered, or densified with sparse_as_dense
    for dense in (False, True):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(emb, [r]) * (r + 1))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=dense)
        (g,) = tape.gradient(loss, [emb])
        assert isinstance(g, tf.IndexedSlices) != dense, type(g)
        want = np.repeat((np.arange(n)[:, None] + 1) / n, 2, axis=1)
        assert np.allclose(tf.convert_to_tensor(g).numpy(), want), (dense, g)
    # compression, variables, objects
    out = hvd.allreduce(tf.constant([1.5 * (r + 1)]), compression=hvd.Compression.fp16)
    assert out.dtype == tf.float32 and np.allclose(out.numpy(), 1.5 * (n + 1) / 2)
    v = tf.Variable([float(r), 1.0])
    hvd.broadcast_variables([v], root_rank=1)
    assert list(v.numpy()) == [1.0, 1.0]
    assert hvd.broadcast_object({"r": r}, root_rank=2) == {"r": 2}
    assert hvd.allgather_object(r * 2) == [k * 2 for k in range(n)]
    hvd.barrier()


def check_process_sets(hvd: Any) -> None:
    """Two disjoint sets (the even and the odd ranks) run their own collectives; at np=3
    the odd set holds one rank."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    ranks = [list(range(0, n, 2)), list(range(1, n, 2))]
    even, odd = hvd.add_process_set(ranks[0]), hvd.add_process_set(ranks[1])
    mine, members = (even, ranks[0]) if r % 2 == 0 else (odd, ranks[1])
    out = hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, process_set=mine)
    assert float(out[0]) == float(sum(members)), out
    g = hvd.allgather(tf.constant([r]), process_set=mine)
    assert list(g.numpy()) == members, g
    root = members[-1]
    b = tf.function(lambda t: hvd.broadcast(t, root, process_set=mine))(tf.constant([r]))
    assert int(b[0]) == root
    hvd.barrier(process_set=mine)
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)


def check_queries_and_elastic(hvd: Any) -> None:
    """Topology ops, and TensorFlowState commit/restore through elastic.run."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    assert int(hvd.size_op()) == n and int(hvd.rank_op()) == r
    assert int(hvd.local_size_op()) == hvd.local_size() and int(hvd.cross_size_op()) >= 1
    assert int(hvd.process_set_included_op()) == 1
    v = tf.Variable([float(r)])
    state = hvd.elastic.TensorFlowState([v], epoch=0)
    attempts = []

    @hvd.elastic.run
    def train(st: Any) -> float:
        attempts.append(float(v.numpy()[0]))
        v.assign_add([1.0])
        if len(attempts) == 1:
            raise hvd.HorovodInternalError("simulated failure")
        st.commit()
        return float(v.numpy()[0])

    # sync gives every rank rank 0's value; the failed attempt is rolled back
    assert train(state) == 1.0 and attempts == [0.0, 0.0], attempts


def check_results_are_kept(hvd: Any) -> None:
    """Results share memory with the engine's result pool (no copy into TensorFlow): a
    result still held keeps its values while later all-reduces of the same shape run,
    eagerly and in tf.function, and the input is never written."""
    import tensorflow as tf

    r, n = hvd.rank(), hvd.size()
    total = sum(range(1, n + 1))
    x = tf.fill([3, 1000], float(r + 1))
    graph = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="kept"))
    held = []
    for k in range(1, 5):
        held.append(hvd.allreduce(x * k, op=hvd.Sum, name=f"kept.{k}"))
        held.append(graph(x * k))
        held.append(hvd.grouped_allreduce([x * k, x[:1] * k], op=hvd.Sum)[0])
    for i, t in enumerate(held):
        _eq(t, np.full((3, 1000), total * (i // 3 + 1)), f"result {i} kept")
    _eq(x, np.full((3, 1000), r + 1), "input untouched")


def tf_job() -> dict[str, Any]:
    import tensorflow as tf

    import unison.tensorflow as hvd

    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    try:
        done = {"ops": check_ops(hvd)}
        check_gradients(hvd)
        check_errors(hvd)
        check_sparse_tape_and_helpers(hvd)
        check_process_sets(hvd)
        check_queries_and_elastic(hvd)
        check_results_are_kept(hvd)
        from tests.keras._checks import keras_checks

        done["keras"] = keras_checks()
        return done
    finally:
        hvd.shutdown()
