"""unison.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` names (Keras 3 on the
TensorFlow backend); the implementation is :mod:`unison.keras`."""

from __future__ import annotations

from ...keras import *  # noqa: F403
from ...keras import __all__ as _keras_all
from ...tensorflow import allgather, allreduce, broadcast

__all__ = [*_keras_all, "allgather", "allreduce", "broadcast"]
