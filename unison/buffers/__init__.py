"""Buffers: numpy/torch adapters, the dtype table and reduction kernels."""

from .adapters import Buffer, as_buffer, is_torch_tensor
from .copy import copy_into
from .dtypes import DType, from_name, from_numpy
from .reduce import (
    Kernel,
    Reducer,
    check_op,
    finalize_average,
    kernel,
    reduce_and_scale,
    reducer,
    scale_in_place,
)

__all__ = [
    "Buffer",
    "DType",
    "Kernel",
    "as_buffer",
    "copy_into",
    "check_op",
    "finalize_average",
    "from_name",
    "from_numpy",
    "is_torch_tensor",
    "kernel",
    "reduce_and_scale",
    "reducer",
    "scale_in_place",
    "Reducer",
]
