"""Buffers: numpy/torch adapters, the dtype table and reduction kernels."""

from .adapters import Buffer, as_buffer, is_torch_tensor
from .copy import copy_into
from .dtypes import DType, from_numpy
from .reduce import Kernel, check_op, finalize_average, kernel

__all__ = [
    "Buffer",
    "DType",
    "Kernel",
    "as_buffer",
    "copy_into",
    "check_op",
    "finalize_average",
    "from_numpy",
    "is_torch_tensor",
    "kernel",
]
