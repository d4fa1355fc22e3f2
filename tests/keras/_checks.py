"""Keras 3 checks run on every rank of one job per backend."""

from __future__ import annotations

from typing import Any

import numpy as np


def _model(keras: Any, seed: int) -> Any:
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                          keras.layers.Dense(1)])  # fmt: skip
    return m


def _data(n: int, per: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n * per, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-1.0], [0.5], [2.0]]) + 0.3).astype("float32")
    return x, y


def keras_checks() -> dict[str, Any]:
    import keras

    import unison.keras as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out: dict[str, Any] = {"backend": keras.backend.backend()}
    b, steps = 4, 3
    x, y = _data(n, b * steps)

    # 1. one epoch of DistributedOptimizer == one process on the concatenated batches
    dist = _model(keras, 0)
    dist.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    xs = np.concatenate([x[(s * n + r) * b : (s * n + r + 1) * b] for s in range(steps)])
    ys = np.concatenate([y[(s * n + r) * b : (s * n + r + 1) * b] for s in range(steps)])
    dist.fit(xs, ys, batch_size=b, epochs=1, shuffle=False, verbose=0,
             callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
    one = _model(keras, 0)
    one.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    one.fit(x, y, batch_size=b * n, epochs=1, shuffle=False, verbose=0)
    for a, c in zip(dist.get_weights(), one.get_weights(), strict=True):
        assert np.allclose(a, c, atol=1e-5), ("distributed != concatenated batch", a, c)

    # 2. backward_passes_per_step=2 with averaging == one step on both batches
    acc = _model(keras, 0)
    acc_opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1), backward_passes_per_step=2, average_aggregated_gradients=True
    )
    acc.compile(optimizer=acc_opt, loss="mse")
    acc.fit(xs[: 2 * b], ys[: 2 * b], batch_size=b, epochs=1, shuffle=False, verbose=0)
    one2 = _model(keras, 0)
    one2.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    both = np.concatenate([x[: n * b], x[n * b : 2 * n * b]])
    both_y = np.concatenate([y[: n * b], y[n * b : 2 * n * b]])
    one2.fit(both, both_y, batch_size=2 * n * b, epochs=1, shuffle=False, verbose=0)
    for a, c in zip(acc.get_weights(), one2.get_weights(), strict=True):
        assert np.allclose(a, c, atol=1e-5), ("backward_passes_per_step", a, c)

    # 3. warm-up learning rate per batch, metric averaging, identical weights
    lrs: list[float] = []
    raw: list[float] = []
    averaged: list[float] = []

    class Probe(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self, sink: list[float], key: str | None) -> None:
            super().__init__()
            self.sink, self.key = sink, key

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.key is None:
                self.sink.append(
                    float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
                )

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self.key is not None:
                self.sink.append(float(logs[self.key]))

    m = _model(keras, 10 + r)  # different initial weights: the broadcast makes them equal
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    warm = 2
    m.fit(
        x[r::n], y[r::n] + r, batch_size=b, epochs=3, shuffle=False, verbose=0,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            Probe(raw, "loss"),
            hvd.callbacks.MetricAverageCallback(),
            Probe(averaged, "loss"),
            hvd.callbacks.LearningRateWarmupCallback(
                0.05, warmup_epochs=warm, steps_per_epoch=steps
            ),
            Probe(lrs, None),
        ],
    )  # fmt: skip
    want = []
    for e in range(3):
        for bt in range(steps):
            if e < warm:
                ep = e + bt / steps + 1 / steps
                want.append(0.05 / n * (ep * (n - 1) / warm + 1))
            else:
                want.append(want[-1])
    assert np.allclose(lrs, want, rtol=1e-5), ("warm-up schedule", lrs, want)
    every_raw = hvd.allgather_object(raw)
    assert np.allclose(averaged, np.mean(every_raw, axis=0), rtol=1e-5), (averaged, every_raw)
    weights = hvd.allgather_object([w.tolist() for w in m.get_weights()])
    for other in weights[1:]:
        for a, c in zip(weights[0], other, strict=True):
            assert np.array_equal(np.array(a), np.array(c)), "weights differ between ranks"
    out["lrs"] = lrs
    check_elastic(keras, hvd, m)
    check_load_model(keras, hvd, m, x, y, b)
    return out


def check_load_model(keras: Any, hvd: Any, model: Any, x: Any, y: Any, b: int) -> None:
    """load_model brings the optimizer back distributed, with its state."""
    import os
    import tempfile

    from unison.keras.optimizer import _Distributed

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.keras")
        model.save(path)
        loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, _Distributed), type(loaded.optimizer)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations)
    loaded.fit(x[:b], y[:b], batch_size=b, epochs=1, verbose=0, shuffle=False)
    weights = hvd.allgather_object([w.tolist() for w in loaded.get_weights()])
    assert weights[0] == weights[-1], "loaded model diverged between ranks"


def check_elastic(keras: Any, hvd: Any, model: Any) -> None:
    """KerasState commit/restore/sync and elastic.run with a fixed set of workers."""
    from unison.torch import HorovodInternalError

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    committed = [w.copy() for w in model.get_weights()]
    calls = []

    @hvd.elastic.run
    def train(st: Any) -> int:
        calls.append(st.epoch)
        model.set_weights([w + 1.0 for w in model.get_weights()])
        st.epoch += 1
        if len(calls) == 1:
            raise HorovodInternalError("simulated failure")
        st.commit()
        return int(st.epoch)

    assert train(state) == 1, calls
    assert calls == [0, 0], calls  # the failed attempt was rolled back to epoch 0
    for a, c in zip(model.get_weights(), committed, strict=True):
        assert np.allclose(a, c + 1.0), "restore did not bring back the committed weights"
    cb = hvd.elastic.UpdateEpochStateCallback(state)
    cb.on_epoch_end(4)
    assert state.epoch == 5


def keras_job() -> dict[str, Any]:
    import unison.keras as hvd

    try:
        return keras_checks()
    finally:
        hvd.shutdown()
