"""Adapters: numpy arrays and torch CPU tensors become a flat :class:`Buffer`.

These are the only functions that know numpy or torch exist; algorithms see a
contiguous 1-D numpy view, its :class:`DType` and its element count.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedError
from .dtypes import DType, from_numpy

__all__ = ["Buffer", "as_buffer", "is_torch_tensor"]


@dataclass(frozen=True)
class Buffer:
    """A flat, contiguous view of a user's array or tensor.

    ``array`` is a 1-D numpy array of ``dtype.storage`` sharing memory with
    ``source``; writing to it writes the user's buffer.
    """

    array: np.ndarray
    dtype: DType
    source: Any

    @property
    def count(self) -> int:
        return int(self.array.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_dtypes() -> dict[Any, DType]:
    import torch

    return {
        torch.bool: DType.BOOL,
        torch.uint8: DType.UINT8,
        torch.int8: DType.INT8,
        torch.int16: DType.INT16,
        torch.int32: DType.INT32,
        torch.int64: DType.INT64,
        torch.float16: DType.FLOAT16,
        torch.bfloat16: DType.BFLOAT16,
        torch.float32: DType.FLOAT32,
        torch.float64: DType.FLOAT64,
    }


def _from_torch(t: Any, what: str) -> Buffer:
    import torch

    if t.device.type != "cpu":
        raise UnsupportedError(
            f"{what} is a {t.device.type} tensor; the native backend moves CPU memory only "
            "(use unison.init(backend='torch') for GPU tensors)"
        )
    if t.is_sparse or t.layout != torch.strided:
        raise InvalidArgumentError(f"{what} must be a dense tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{what} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
            "call .contiguous() first"
        )
    dtype = _torch_dtypes().get(t.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"{what} has unsupported dtype {t.dtype}")
    d = t.detach()
    if dtype is DType.BFLOAT16:
        d = d.view(torch.int16)
    arr = d.numpy().reshape(-1)
    return Buffer(arr, dtype, t)


def as_buffer(obj: Any, what: str = "buffer", *, writable: bool = True) -> Buffer:
    """Flatten ``obj`` (numpy array or torch CPU tensor) without copying.

    Raises :class:`InvalidArgumentError` for anything that is not a contiguous
    buffer of a supported dtype, before anything is sent.
    """
    if isinstance(obj, Buffer):
        return obj
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{what} must be C-contiguous (shape {obj.shape}, strides {obj.strides}); "
                "use np.ascontiguousarray first"
            )
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError(f"{what} is read-only but the operation writes into it")
        dtype = from_numpy(obj.dtype)
        if dtype is None:
            raise InvalidArgumentError(f"{what} has unsupported dtype {obj.dtype}")
        return Buffer(obj.reshape(-1), dtype, obj)
    if is_torch_tensor(obj):
        return _from_torch(obj, what)
    raise InvalidArgumentError(
        f"{what} must be a numpy array or a torch tensor, got {type(obj).__name__}"
    )
