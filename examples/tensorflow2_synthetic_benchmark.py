"""Synthetic TensorFlow 2 benchmark in the style of Horovod's tensorflow2_synthetic_benchmark.py.

    unison run -np 2 python examples/tensorflow2_synthetic_benchmark.py            # unison
    python examples/tensorflow2_synthetic_benchmark.py --mode mwms --np 2          # TF's own

``--mode unison`` (under ``unison run``): a Keras model trained on random
batches with ``hvd.DistributedGradientTape`` inside ``tf.function``.
``--mode mwms`` starts ``--np`` worker processes on localhost with ``TF_CONFIG``
and trains the same model with ``tf.distribute.MultiWorkerMirroredStrategy``
(TensorFlow's CPU collective ops over gRPC). Both print the mean step time and
images/s; ``--op-cost`` also times a 4-byte ``hvd.allreduce`` eagerly and in
``tf.function``. The model (``--model mlp``, about 13 M parameters, or
``--model cnn``) is sized to 5-25 M parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_model(tf: object, kind: str) -> object:
    keras = tf.keras  # type: ignore[attr-defined]
    if kind == "cnn":
        layers = [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Conv2D(128, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1000),
        ]
    else:
        layers = [
            keras.Input((32, 32, 3)),
            keras.layers.Flatten(),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(1000),
        ]
    return keras.Sequential(layers)


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["unison", "mwms"], default="unison")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--num-warmup-batches", type=int, default=5)
    ap.add_argument("--num-batches-per-iter", type=int, default=5)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--np", type=int, default=2, help="workers (mwms mode)")
    ap.add_argument("--op-cost", action="store_true", help="time a 4-byte allreduce (unison)")
    ap.add_argument("--json", help="write the result here (rank 0 / chief)")
    ap.add_argument("--worker-index", type=int, default=-1, help=argparse.SUPPRESS)
    return ap


def _report(
    args: argparse.Namespace, mode: str, workers: int, steps: list[float], extra: dict
) -> None:
    mean = sum(steps) / len(steps)
    result = {
        "mode": mode, "model": args.model, "workers": workers, "batch_size": args.batch_size,
        "step_time_s": mean, "images_per_s": args.batch_size * workers / mean, **extra,
    }  # fmt: skip
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


def _timed(step, args: argparse.Namespace) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(args.num_warmup_batches):
        step()
    times = []
    for _ in range(args.num_iters):
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step()
        times.append((time.perf_counter() - t0) / args.num_batches_per_iter)
    return times


def run_unison(args: argparse.Namespace) -> None:
    import numpy as np
    import tensorflow as tf

    import unison.tensorflow as hvd

    hvd.init()
    model = build_model(tf, args.model)
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform([args.batch_size, 32, 32, 3])
    target = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)

    @tf.function
    def train_step(first: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    train_step(True)
    steps = _timed(lambda: train_step(False), args)
    extra: dict = {"params": int(sum(np.prod(v.shape) for v in model.trainable_variables))}
    if args.op_cost:
        x = tf.constant([1.0])
        graph = tf.function(lambda t: hvd.allreduce(t, name="op_cost"))
        graph(x)
        for label, fn in (("eager", lambda: hvd.allreduce(x)), ("tf_function", lambda: graph(x))):
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            extra[f"allreduce_4B_{label}_s"] = (time.perf_counter() - t0) / 200
    if hvd.rank() == 0:
        _report(args, "unison", hvd.size(), steps, extra)
    hvd.shutdown()


def run_mwms_worker(args: argparse.Namespace) -> None:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model(tf, args.model)
        opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    data = tf.random.uniform([args.batch_size, 32, 32, 3])
    target = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    global_batch = args.batch_size * strategy.num_replicas_in_sync

    def replica_step() -> None:
        with tf.GradientTape() as tape:
            per_example = loss_fn(target, model(data, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    @tf.function
    def train_step() -> None:
        strategy.run(replica_step)

    steps = _timed(train_step, args)
    if args.worker_index == 0:
        _report(args, "mwms", strategy.num_replicas_in_sync, steps, {})


def launch_mwms(args: argparse.Namespace) -> int:
    ports = []
    for _ in range(args.np):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(args.np):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        argv = [a for a in sys.argv[1:] if not a.startswith("--worker-index")]
        procs.append(
            subprocess.Popen([sys.executable, __file__, *argv, f"--worker-index={i}"], env=env)
        )
    return max(p.wait() for p in procs)


def main() -> int:
    args = args_parser().parse_args()
    if args.mode == "mwms":
        if args.worker_index < 0:
            return launch_mwms(args)
        run_mwms_worker(args)
        return 0
    run_unison(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
