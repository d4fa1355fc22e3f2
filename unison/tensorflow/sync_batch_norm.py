"""``SyncBatchNormalization``: a Keras batch normalization whose training statistics are
those of the whole batch over every worker (mean and mean of squares averaged)."""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from ..horovod.basics import size
from .mpi_ops import Sum, allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):  # type: ignore[misc]
    """Batch normalization synchronized over all workers while training (the layer of
    ``tf.keras``: Keras 3, or Keras 2 with ``TF_USE_LEGACY_KERAS=1``). Each worker's
    batch counts alike: the global mean is the workers' mean of means, the variance
    ``E[x^2] - E[x]^2`` over the workers."""

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        if "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters:
            kwargs["fused"] = fused  # Keras 2's layer takes it, Keras 3's has none
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        mean, variance = super()._moments(inputs, *args, **kwargs)
        n = size()
        if n == 1:
            return mean, variance
        stats = tf.stack([mean, variance + tf.math.square(mean)])
        stats = allreduce(stats, op=Sum) / tf.cast(n, stats.dtype)
        group_mean, group_mean_of_square = tf.unstack(stats)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
