"""The seam between TensorFlow and the framework-neutral engine (:mod:`unison.horovod`).

The engine negotiates, fuses, caches and times operations on flat buffers. This
adapter views an eager ``tf.Tensor``'s values as such a buffer (:func:`to_buffer`:
through DLPack, no copy; ``Tensor.numpy()`` copies) and makes the engine's result
buffer a ``tf.Tensor`` again (:func:`from_buffer`: one copy into TensorFlow). Eagerly it
runs at once, inside ``tf.function`` it runs through ``tf.py_function`` (the
engine's mismatch errors surface as TensorFlow's ``FailedPreconditionError`` there as
in Horovod). No torch anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ..buffers import Buffer, DType
from ..horovod import ops as _ops
from ..horovod.basics import ProcessSet
from ..horovod.errors import TensorMismatchError

__all__ = [
    "SUPPORTED",
    "check_member",
    "from_buffer",
    "from_torch",
    "graph_name",
    "run",
    "to_buffer",
    "to_torch",
    "values_of",
    "wait",
]

SUPPORTED = (
    tf.uint8,
    tf.int8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
)

_DTYPES = {
    tf.uint8: DType.UINT8,
    tf.int8: DType.INT8,
    tf.int16: DType.INT16,
    tf.int32: DType.INT32,
    tf.int64: DType.INT64,
    tf.float16: DType.FLOAT16,
    tf.bfloat16: DType.BFLOAT16,
    tf.float32: DType.FLOAT32,
    tf.float64: DType.FLOAT64,
    tf.bool: DType.BOOL,
}


class _DLPackOf:
    """An eager tensor as numpy's :func:`numpy.from_dlpack` takes it (TensorFlow hands
    out a bare DLPack capsule; numpy asks an object for one)."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def __dlpack__(self, **_: Any) -> Any:
        return tf.experimental.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # DLPack's CPU device


def values_of(t: Any) -> np.ndarray:
    """Eager tensor ``t``'s values as a read-only numpy array sharing its memory where
    DLPack carries the dtype (``Tensor.numpy()`` copies, tens of milliseconds for a
    large gradient, into freshly faulted pages); else that copy."""
    if t.dtype != tf.bfloat16:  # numpy has no bfloat16 to receive
        try:
            return np.from_dlpack(_DLPackOf(t))
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass  # a tensor DLPack cannot export: copy it
    copied: np.ndarray = t.numpy()
    return copied


def to_buffer(t: Any) -> Buffer:
    """Eager tensor ``t``'s values as an engine buffer (no copy where DLPack carries its
    dtype: the engine only reads it)."""
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise ValueError(f"Tensor type {t.dtype.name} is not supported.")
    a = np.require(values_of(t), requirements="C")  # keeps 0-d arrays 0-d
    flat = a.reshape(-1)
    if dt is DType.BFLOAT16:
        flat = flat.view(np.int16)
    return Buffer(flat, dt, a)


def from_buffer(b: Buffer, dtype: tf.DType) -> tf.Tensor:
    """The engine's result buffer as a ``tf.Tensor`` of ``dtype`` (its shape: the
    buffer's)."""
    a = b.array.reshape(b.shape)
    if b.dtype is DType.BFLOAT16:
        a = a.view(tf.bfloat16.as_numpy_dtype)
    return tf.convert_to_tensor(a, dtype=dtype)


def to_torch(t: Any) -> Any:
    """A CPU torch tensor holding the values of eager tensor ``t`` (a copy), for code
    that wants one; needs torch (the engine itself takes :func:`to_buffer`'s buffers)."""
    import torch

    b = to_buffer(t)
    x = torch.from_numpy(np.array(b.array, copy=True).reshape(b.shape))
    return x.view(torch.bfloat16) if b.dtype is DType.BFLOAT16 else x


def from_torch(x: Any, dtype: tf.DType) -> tf.Tensor:
    """A CPU torch tensor as a ``tf.Tensor`` of ``dtype`` (needs torch)."""
    import torch

    x = x.contiguous()
    if x.dtype is torch.bfloat16:
        return tf.convert_to_tensor(x.view(torch.int16).numpy().view(tf.bfloat16.as_numpy_dtype))
    return tf.convert_to_tensor(x.numpy(), dtype=dtype)


def wait(handle: Any) -> Any:
    """The engine's result, with a mismatch raised as TensorFlow raises Horovod's."""
    try:
        return _ops.synchronize(handle)
    except TensorMismatchError as e:
        raise tf.errors.FailedPreconditionError(None, None, str(e)) from e


def graph_name(prefix: str, t: Any, name: str | None) -> str | None:
    """Names of operations traced into a graph: Horovod's ``Horovod<Op>_<tensor name>``,
    fixed at trace time so every execution of the graph negotiates under one name."""
    if name is not None or tf.executing_eagerly():
        return name
    tname = getattr(t, "name", "") or "t"
    return f"Horovod{prefix}_{tname.replace(':', '_').replace('/', '_')}"


def run(
    fn: Callable[[list[tf.Tensor]], list[tf.Tensor]],
    inputs: Sequence[Any],
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[Any],
) -> list[tf.Tensor]:
    """``fn`` on eager tensors now, or as a ``tf.py_function`` inside a graph."""
    ins = [tf.convert_to_tensor(t) for t in inputs]
    if tf.executing_eagerly():
        return list(fn(ins))
    body = tf.autograph.experimental.do_not_convert(lambda *xs: fn(list(xs)))
    outs = tf.py_function(func=body, inp=ins, Tout=list(out_dtypes))
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o, s in zip(outs, out_shapes, strict=True):
        if s is not None:
            o.set_shape(s)
    return outs


def check_member(ps: ProcessSet) -> None:
    if not ps.included():
        raise ValueError(f"this rank is not a member of {ps}")
