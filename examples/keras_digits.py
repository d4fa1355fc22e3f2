"""Data-parallel training of a Keras 3 CNN on scikit-learn's handwritten digits.

    KERAS_BACKEND=tensorflow unison run -np 2 python examples/keras_digits.py
    KERAS_BACKEND=torch      unison run -np 2 python examples/keras_digits.py
    KERAS_BACKEND=jax        unison run -np 2 python examples/keras_digits.py

Written as for Horovod's Keras API (``import unison.keras as hvd``): each rank
trains on its shard of the training set, ``hvd.DistributedOptimizer`` averages
the gradients, ``BroadcastGlobalVariablesCallback`` starts every rank from rank
0's weights, ``MetricAverageCallback`` averages the logged metrics and
``LearningRateWarmupCallback`` ramps the learning rate over the first epochs.
The global batch is fixed (``--batch-size``, split over the ranks). At the end
the script checks the test accuracy and that every rank holds identical weights,
and exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import unison.keras as hvd


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    args = ap.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {size} ranks")
    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the broadcast fixes it
    xtr, ytr, xte, yte = load_data(args.seed)
    xs, ys = xtr[rank::size], ytr[rank::size]
    local_batch = args.batch_size // size
    steps = len(xtr) // size // local_batch
    xs, ys = xs[: steps * local_batch], ys[: steps * local_batch]

    model = build_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr))
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            args.lr, warmup_epochs=args.warmup_epochs, steps_per_epoch=steps
        ),
    ]
    model.fit(
        xs, ys, batch_size=local_batch, epochs=args.epochs, callbacks=callbacks,
        verbose=2 if rank == 0 else 0, shuffle=True,
    )  # fmt: skip

    # every rank evaluates its shard of the test set; the counts are summed
    logits = model.predict(xte[rank::size], verbose=0)
    correct = int((np.argmax(logits, axis=1) == yte[rank::size]).sum())
    total = hvd.allreduce_numpy([np.array([correct, len(yte[rank::size])], np.int64)], hvd.Sum)[0]
    accuracy = float(total[0]) / float(total[1])
    digests = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    identical = all(d == digests[0] for d in digests)
    if rank == 0:
        print(
            f"backend={keras.backend.backend()} ranks={size} test accuracy={accuracy:.4f} "
            f"identical weights on all ranks: {identical}"
        )
    hvd.shutdown()
    ok = accuracy >= args.min_accuracy and identical
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
