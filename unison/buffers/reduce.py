"""Reduction kernels: numpy ufuncs writing into preallocated buffers (``out=``).

A kernel is ``kernel(a, b, out)`` computing ``out = a (op) b`` elementwise on
storage-typed 1-D arrays; ``out`` may alias ``a``. No array is allocated per call
(bfloat16 goes through torch views, also without copies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._types import ReduceOp
from ..errors import InvalidArgumentError
from .dtypes import DType

__all__ = ["Kernel", "check_op", "finalize_average", "kernel"]

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

_BOOL_UFUNC = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}


def check_op(op: ReduceOp, dtype: DType) -> None:
    """Raise InvalidArgumentError if ``op`` cannot reduce ``dtype``."""
    if op.is_bitwise and not dtype.is_bitwise_ok:
        raise InvalidArgumentError(
            f"reduce op {op.name} needs an integer or bool buffer, got {dtype.label}"
        )
    if op is ReduceOp.AVG and dtype is DType.BOOL:
        raise InvalidArgumentError("reduce op AVG is undefined for bool buffers")


def _bf16_kernel(op: ReduceOp) -> Kernel:
    import torch

    fn: Any = {
        ReduceOp.SUM: torch.add,
        ReduceOp.AVG: torch.add,
        ReduceOp.PRODUCT: torch.mul,
        ReduceOp.MIN: torch.minimum,
        ReduceOp.MAX: torch.maximum,
    }[op]

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        ta = torch.from_numpy(a).view(torch.bfloat16)
        tb = torch.from_numpy(b).view(torch.bfloat16)
        fn(ta, tb, out=torch.from_numpy(out).view(torch.bfloat16))

    return run


def kernel(op: ReduceOp, dtype: DType) -> Kernel:
    """The elementwise kernel for ``op`` on ``dtype`` (validated by :func:`check_op`)."""
    check_op(op, dtype)
    if dtype is DType.BFLOAT16:
        return _bf16_kernel(op)
    ufunc = _BOOL_UFUNC[op] if dtype is DType.BOOL else _UFUNC[op]

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        ufunc(a, b, out=out)

    return run


def finalize_average(arr: np.ndarray, dtype: DType, size: int) -> None:
    """Divide a summed buffer by ``size`` in place (integers truncate toward zero)."""
    if size == 1 or arr.shape[0] == 0:
        return
    if dtype is DType.BFLOAT16:
        import torch

        t = torch.from_numpy(arr).view(torch.bfloat16)
        t.div_(size)
    elif dtype.is_floating:
        np.divide(arr, arr.dtype.type(size), out=arr)
    else:
        neg = arr < 0
        np.abs(arr, out=arr)
        np.floor_divide(arr, size, out=arr)
        np.negative(arr, out=arr, where=neg)
