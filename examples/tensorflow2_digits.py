"""A TensorFlow 2 custom training loop on scikit-learn's digits with unison.tensorflow.

    unison run -np 2 python examples/tensorflow2_digits.py

Written as for ``horovod.tensorflow``: each rank trains on its shard, the
training step is a ``tf.function`` whose ``hvd.DistributedGradientTape``
averages the gradients over ranks, and after the first step every rank takes
rank 0's variables (``hvd.broadcast_variables``). The global batch is fixed
(``--batch-size``, split over the ranks). At the end the script checks the
test accuracy and that every rank holds identical weights, and exits non-zero
otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import tensorflow as tf

import unison.tensorflow as hvd


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    args = ap.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {size} ranks")
    tf.random.set_seed(args.seed + rank)  # different on purpose: the broadcast fixes it
    xtr, ytr, xte, yte = load_data(args.seed)
    local_batch = args.batch_size // size
    data = (
        tf.data.Dataset.from_tensor_slices((xtr[rank::size], ytr[rank::size]))
        .shuffle(2048, seed=args.seed + rank)
        .batch(local_batch, drop_remainder=True)
    )
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(2),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.Adam(args.lr)

    @tf.function
    def training_step(images: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            # after the first step, when the optimizer's variables exist
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    first = True
    for epoch in range(args.epochs):
        losses = []
        for images, labels in data:
            losses.append(float(training_step(images, labels, first)))
            first = False
        mean = float(hvd.allreduce(tf.constant(np.mean(losses)), name=f"loss.{epoch}"))
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean:.4f}", flush=True)

    logits = model(xte[rank::size], training=False)
    correct = int((np.argmax(logits.numpy(), axis=1) == yte[rank::size]).sum())
    counts = hvd.allreduce(tf.constant([correct, len(yte[rank::size])], tf.int64), op=hvd.Sum)
    accuracy = float(counts[0]) / float(counts[1])
    digests = hvd.allgather_object([v.numpy().tobytes() for v in model.variables])
    identical = all(d == digests[0] for d in digests)
    if rank == 0:
        print(f"ranks={size} test accuracy={accuracy:.4f} identical weights: {identical}")
    hvd.shutdown()
    return 0 if accuracy >= args.min_accuracy and identical else 1


if __name__ == "__main__":
    sys.exit(main())
