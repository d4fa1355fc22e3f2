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
    #: element count of a device (GPU) tensor, whose ``array`` is an empty placeholder:
    #: only engines that accept device buffers (torch.distributed/NCCL) ever see one
    device_count: int | None = None
    #: the dtype of the caller's tensor where this buffer is a copy of it in another
    #: dtype (torch.distributed stages bfloat16 as float32): what the operation's
    #: signature names, so that ranks that passed different dtypes disagree
    declared: DType | None = None

    @property
    def sig_dtype(self) -> DType:
        """The dtype signatures carry: the caller's (:attr:`declared`), else :attr:`dtype`."""
        return self.dtype if self.declared is None else self.declared

    @property
    def count(self) -> int:
        return int(self.array.shape[0]) if self.device_count is None else self.device_count

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    @property
    def on_device(self) -> bool:
        return self.device_count is not None

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


def _from_torch(t: Any, what: str, device_ok: bool = False) -> Buffer:
    import torch

    if t.device.type != "cpu" and not device_ok:
        raise UnsupportedError(
            f"{what} is a {t.device.type} tensor; this operation moves CPU memory only here "
            "(GPU tensors: broadcast, all_reduce and reduce with unison.init(backend='torch'))"
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
    if t.device.type != "cpu":
        return Buffer(np.empty(0, dtype.storage), dtype, t, device_count=int(t.numel()))
    d = t.detach()
    if dtype is DType.BFLOAT16:
        d = d.view(torch.int16)
    arr = d.numpy().reshape(-1)
    return Buffer(arr, dtype, t)


def as_buffer(
    obj: Any, what: str = "buffer", *, writable: bool = True, device_ok: bool = False
) -> Buffer:
    """Flatten ``obj`` (numpy array or torch CPU tensor) without copying.

    Raises :class:`InvalidArgumentError` for anything that is not a contiguous
    buffer of a supported dtype, before anything is sent. GPU tensors are accepted
    only with ``device_ok`` (an engine that moves device memory itself).
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
        return _from_torch(obj, what, device_ok)
    raise InvalidArgumentError(
        f"{what} must be a numpy array or a torch tensor, got {type(obj).__name__}"
    )
