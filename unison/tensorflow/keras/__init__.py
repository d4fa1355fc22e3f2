"""unison.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` names for ``tf.keras``:
Keras 3 on the TensorFlow backend (:mod:`unison.keras`), or Keras 2 where ``tf.keras``
is ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``): then the optimizer wrapper, ``load_model``
and the callbacks are those of :mod:`unison.tensorflow.keras.keras2`."""

from __future__ import annotations

from types import SimpleNamespace

import tensorflow as tf

from ...keras import *  # noqa: F403
from ...keras import __all__ as _keras_all

__all__ = list(_keras_all)


def _is_tf_keras() -> bool:
    """Whether ``tf.keras`` is Keras 2 (``tf_keras``). Its module name does not say:
    ``tensorflow.keras`` (TensorFlow's lazy loader, also after ``from
    tensorflow.keras.optimizers import ...``) whichever Keras it serves; a class it holds
    names the package for certain."""
    return str(tf.keras.optimizers.Optimizer.__module__).split(".")[0] == "tf_keras"


if _is_tf_keras():
    from . import keras2 as _k2

    DistributedOptimizer = _k2.DistributedOptimizer
    PartialDistributedOptimizer = _k2.PartialDistributedOptimizer
    load_model = _k2.load_model
    callbacks = SimpleNamespace(  # type: ignore[assignment]
        BroadcastGlobalVariablesCallback=_k2.BroadcastGlobalVariablesCallback,
        MetricAverageCallback=_k2.MetricAverageCallback,
        LearningRateScheduleCallback=_k2.LearningRateScheduleCallback,
        LearningRateWarmupCallback=_k2.LearningRateWarmupCallback,
    )
