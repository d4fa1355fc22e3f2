"""unison.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` names (Keras 3 on the
TensorFlow backend); the implementation is :mod:`unison.keras`."""

from __future__ import annotations

from ...keras import *  # noqa: F403
from ...keras import __all__ as _keras_all

__all__ = list(_keras_all)
