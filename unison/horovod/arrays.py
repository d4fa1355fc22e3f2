"""The engine's buffers: :class:`unison.buffers.Buffer` made, scaled and converted.

The engine moves flat numpy views (:class:`~unison.buffers.Buffer`: a 1-D array of the
element type's storage, its :class:`~unison.buffers.DType` and the user's object for
the shape). A front end builds one per tensor without copying (a CPU torch tensor's
memory, a numpy array) and turns the engine's result buffers back into its own
tensors. bfloat16 has no numpy type: it travels as 16-bit storage, and the scaling
here computes it (and float16) in float32 and rounds once, as torch does.

:func:`scale` is the engine's one scaling rule: floats are multiplied in their own
precision, integers in double precision and truncated toward zero, booleans left
alone. The reduction between ranks is :func:`unison.buffers.kernel` (rank order,
numpy's floating-point warnings off).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._types import ReduceOp
from ..buffers import Buffer, DType, Kernel, kernel
from .negotiation import HvdOp

__all__ = [
    "COMM_OP",
    "as_float64",
    "dtype_of",
    "factor_of",
    "from_float64",
    "new_buffer",
    "numel",
    "payload",
    "reduce_bf16",
    "reduce_kernel",
    "scale",
    "scaled",
    "zeros",
]

#: the core's reduction for each of Horovod's ops (Average sums, then scales)
COMM_OP = {
    HvdOp.AVERAGE: ReduceOp.SUM,
    HvdOp.SUM: ReduceOp.SUM,
    HvdOp.MIN: ReduceOp.MIN,
    HvdOp.MAX: ReduceOp.MAX,
    HvdOp.PRODUCT: ReduceOp.PRODUCT,
}


def dtype_of(label: str) -> DType:
    """The element type a request's dtype label names (``"float32"``...)."""
    try:
        return DType[label.upper()]
    except KeyError:
        raise ValueError(f"unknown dtype {label!r}") from None


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def new_buffer(dtype: DType, shape: Sequence[int]) -> Buffer:
    """An uninitialised buffer of ``shape`` (its source: the shaped numpy array)."""
    arr = np.empty(tuple(shape), dtype.storage)
    return Buffer(arr.reshape(-1), dtype, arr)


def zeros(dtype: DType, shape: Sequence[int]) -> Buffer:
    arr = np.zeros(tuple(shape), dtype.storage)
    return Buffer(arr.reshape(-1), dtype, arr)


def payload(b: Buffer) -> object:
    """What the core's collectives take for ``b``: the plain array (the caller-thread
    path takes those), or the Buffer itself where the storage type is not the element
    type (bfloat16)."""
    return b if b.dtype is DType.BFLOAT16 else b.array


_KERNELS: dict[tuple[ReduceOp, DType], Kernel] = {}


def _kernel(op: ReduceOp, dtype: DType) -> Kernel:
    k = _KERNELS.get((op, dtype))
    if k is None:
        k = _KERNELS[(op, dtype)] = kernel(op, dtype)
    return k


def reduce_kernel(op: int, dtype: DType) -> Kernel:
    """The elementwise reduction of Horovod's ``op`` (Average: the sum) on ``dtype``
    (:func:`unison.buffers.kernel`: numpy's floating-point warnings off)."""
    return _kernel(COMM_OP[HvdOp(op)], dtype)


def factor_of(dtype: DType, factor: float) -> np.ndarray:
    """``factor`` as a one-element array of a floating ``dtype`` (what numpy rounds a
    Python float to when it multiplies an array of that type)."""
    return np.array([factor], dtype.storage)


def _bf16_to_f32(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(f: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 storage, to nearest even (NaN stays NaN)."""
    u = f.astype(np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, (u >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16).view(np.int16)


def scaled(a: np.ndarray, dtype: DType, factor: float) -> np.ndarray:
    """``a`` (storage of ``dtype``) times ``factor`` as a new array (``a`` itself when
    ``factor`` is 1): floats in their own precision, integers in double precision and
    truncated, booleans unchanged."""
    if factor == 1.0 or a.size == 0 or dtype is DType.BOOL:
        return a
    if dtype is DType.BFLOAT16:
        return _f32_to_bf16(_bf16_to_f32(a) * np.float32(factor))
    if dtype is DType.FLOAT16:  # in float32, rounded once (as torch and Horovod do)
        return (a.astype(np.float32) * np.float32(factor)).astype(np.float16)
    if dtype.is_floating:
        out = np.empty_like(a)
        _kernel(ReduceOp.PRODUCT, dtype)(a, factor_of(dtype, factor), out)
        return out
    return np.trunc(a.astype(np.float64) * factor).astype(a.dtype)


def scale(a: np.ndarray, dtype: DType, factor: float, out: np.ndarray | None = None) -> None:
    """Write ``a`` times ``factor`` (:func:`scaled`'s rule) into ``out`` (default: ``a``)."""
    dst = a if out is None else out
    if factor == 1.0 or a.size == 0 or dtype is DType.BOOL:
        if dst is not a:
            np.copyto(dst, a)
        return
    if dtype in (DType.FLOAT32, DType.FLOAT64):
        _kernel(ReduceOp.PRODUCT, dtype)(a, factor_of(dtype, factor), dst)
        return
    dst[...] = scaled(a, dtype, factor)


_BF16_UFUNC = {
    HvdOp.AVERAGE: np.add,
    HvdOp.SUM: np.add,
    HvdOp.MIN: np.minimum,
    HvdOp.MAX: np.maximum,
    HvdOp.PRODUCT: np.multiply,
}


def reduce_bf16(parts: list[np.ndarray], op: int) -> np.ndarray:
    """bfloat16 parts (int16 storage) reduced in rank order, each step computed in
    float32 and rounded to bfloat16 (what torch's bfloat16 kernels do), with numpy only."""
    ufunc = _BF16_UFUNC[HvdOp(op)]
    acc = parts[0]
    with np.errstate(all="ignore"):
        for p in parts[1:]:
            acc = _f32_to_bf16(ufunc(_bf16_to_f32(acc), _bf16_to_f32(p)))
    return acc.copy() if acc is parts[0] else acc


def as_float64(b: Buffer) -> np.ndarray:
    """``b``'s values in double precision (a new array)."""
    if b.dtype is DType.BFLOAT16:
        return _bf16_to_f32(b.array).astype(np.float64)
    return b.array.astype(np.float64)


def from_float64(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Double-precision ``values`` as storage of ``dtype``."""
    if dtype is DType.BFLOAT16:
        return _f32_to_bf16(values.astype(np.float32))
    return values.astype(dtype.storage)
