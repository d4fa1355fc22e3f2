"""The seam between TensorFlow and the shared engine of :mod:`unison.torch`.

One engine serves every framework: it negotiates, fuses, caches and times
operations on CPU ``torch`` tensors. This adapter turns a ``tf.Tensor`` into
such a buffer (through numpy) and the engine's result back into a
``tf.Tensor``; eagerly it runs at once, inside ``tf.function`` it runs through
``tf.py_function`` (the engine's mismatch errors surface as TensorFlow's
``FailedPreconditionError`` there as in Horovod).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import torch

from ..torch import ops as _ops
from ..torch.basics import ProcessSet
from ..torch.errors import TensorMismatchError

__all__ = ["SUPPORTED", "from_torch", "graph_name", "run", "to_torch", "wait"]

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


def to_torch(t: Any) -> torch.Tensor:
    """A CPU torch tensor holding the values of eager tensor ``t`` (a copy)."""
    if t.dtype not in SUPPORTED:
        raise ValueError(f"Tensor type {t.dtype.name} is not supported.")
    a = np.array(t.numpy(), copy=True)
    if t.dtype == tf.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_torch(x: torch.Tensor, dtype: tf.DType) -> tf.Tensor:
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
