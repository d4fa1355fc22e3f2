"""unison.keras: Horovod's Keras API for Keras 3 on every backend.

``import unison.keras as hvd`` under ``KERAS_BACKEND=tensorflow``, ``torch`` or
``jax``: ``DistributedOptimizer`` averages gradients over ranks before Keras
applies them, the callbacks broadcast the initial variables, average metrics
and schedule the learning rate, and everything runs on the framework-neutral engine
:mod:`unison.horovod` (negotiation, fusion, cache, timeline, mismatch errors).
"""

from __future__ import annotations

from .._version import require_framework

require_framework("keras", "unison.keras", "keras")  # if missing: an install hint

from typing import Any

import keras
import numpy as np

from ..horovod.basics import (
    ProcessSet,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)
from ..horovod.functions import allgather_object, broadcast_object
from ..horovod.negotiation import HvdOp
from . import callbacks, elastic
from ._engine import allgather_numpy, allreduce_numpy, broadcast_numpy
from .callbacks import broadcast_global_variables
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model

Average = HvdOp.AVERAGE
Sum = HvdOp.SUM
Adasum = HvdOp.ADASUM
Min = HvdOp.MIN
Max = HvdOp.MAX
Product = HvdOp.PRODUCT


class _NoneCompressor:
    """No compression."""


class FP16Compressor:
    """Floating-point gradients travel as float16."""


class Compression:
    """Horovod's compressor names; ``fp16`` halves the bytes of floating gradients."""

    none = _NoneCompressor
    fp16 = FP16Compressor


_NoneCompressor.__name__ = "NoneCompressor"


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Any = Compression.none,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Horovod's ``hvd.allreduce(value)`` of the Keras API: a numpy array."""
    from ..horovod.ops import handle_average_backwards_compatibility

    rop = handle_average_backwards_compatibility(op, average)
    a = keras.ops.convert_to_numpy(value)
    return allreduce_numpy(
        [a], rop, prescale_factor, postscale_factor, process_set, compression is FP16Compressor
    )[0]


def allgather(
    value: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Every rank's ``value`` concatenated along the first dimension (a numpy array)."""
    return allgather_numpy(keras.ops.convert_to_numpy(value), process_set)


def broadcast(
    value: Any,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """``root_rank``'s ``value`` on every rank (a numpy array)."""
    return broadcast_numpy([keras.ops.convert_to_numpy(value)], root_rank, process_set)[0]


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_numpy",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_numpy",
    "broadcast_object",
    "callbacks",
    "cross_rank",
    "cross_size",
    "elastic",
    "global_process_set",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "rank",
    "remove_process_set",
    "shutdown",
    "size",
]
