"""Keras 3, any backend, on the framework-neutral engine (:mod:`unison.horovod`).

Values reach the engine as buffers: numpy arrays on the JAX backend (through
``jax.pure_callback`` inside ``jit``) and for the callbacks, CPU torch tensors'
memory on the torch backend (through :mod:`unison.torch`), and through
:mod:`unison.tensorflow` (``tf.py_function`` inside a ``tf.function``) on the
TensorFlow backend. Nothing here imports a framework the backend does not use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from ..buffers import Buffer, DType, from_numpy
from ..horovod import ops as _ops
from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.negotiation import HvdOp

__all__ = ["allgather_numpy", "allreduce_grads", "allreduce_numpy", "broadcast_numpy", "is_fp16"]


def _to_buffer(a: np.ndarray) -> Buffer:
    """A numpy array (bfloat16 from ml_dtypes included) as an engine buffer, no copy
    where it is contiguous already."""
    a = np.require(a, requirements="C")  # keeps 0-d arrays 0-d
    if a.dtype.name == "bfloat16":
        return Buffer(a.reshape(-1).view(np.int16), DType.BFLOAT16, a)
    dt = from_numpy(a.dtype)
    if dt is None:
        raise ValueError(f"Tensor type {a.dtype} is not supported.")
    return Buffer(a.reshape(-1), dt, a)


def _to_numpy(b: Buffer, like: np.dtype) -> np.ndarray:
    """A result buffer as an array of its shape (bfloat16 as ``like``, its numpy type)."""
    a = b.array.reshape(b.shape)
    return a.view(like) if b.dtype is DType.BFLOAT16 else a


def _half(b: Buffer) -> Buffer:
    """A floating buffer as float16 (Horovod's fp16 compression), others unchanged."""
    if not b.dtype.is_floating or b.dtype is DType.FLOAT16:
        return b
    h = np.asarray(b.source).astype(np.float16)
    return Buffer(h.reshape(-1), DType.FLOAT16, h)


def allreduce_numpy(
    arrays: Sequence[Any],
    op: HvdOp = HvdOp.AVERAGE,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set: ProcessSet = global_process_set,
    fp16: bool = False,
) -> list[np.ndarray]:
    """One grouped allreduce of numpy arrays (one request per dtype)."""
    arrs = [np.asarray(a) for a in arrays]
    ins = [_to_buffer(a) for a in arrs]
    if fp16:
        ins = [_half(b) for b in ins]
    out: list[np.ndarray] = [np.empty(0)] * len(arrs)
    groups: dict[DType, list[int]] = {}
    for i, b in enumerate(ins):
        groups.setdefault(b.dtype, []).append(i)
    handles = [
        (
            idx,
            _ops.grouped_allreduce_async(
                [ins[i] for i in idx],
                op=op,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
            ),
        )
        for idx in groups.values()
    ]
    for idx, h in handles:
        for i, r in zip(idx, _ops.synchronize(h), strict=True):
            out[i] = (
                _to_numpy(r, arrs[i].dtype).astype(arrs[i].dtype, copy=False).reshape(arrs[i].shape)
            )
    return out


def broadcast_numpy(
    arrays: Sequence[Any], root_rank: int, process_set: ProcessSet = global_process_set
) -> list[np.ndarray]:
    arrs = [np.asarray(a) for a in arrays]
    hs = [
        _ops.broadcast_async(_to_buffer(a), int(root_rank), process_set=process_set) for a in arrs
    ]
    return [
        _to_numpy(_ops.synchronize(h), a.dtype).reshape(a.shape)
        for h, a in zip(hs, arrs, strict=True)
    ]


def is_fp16(compression: Any) -> bool:
    return getattr(compression, "__name__", "") == "FP16Compressor"


def allreduce_grads(
    grads: list[Any],
    op: HvdOp,
    prescale: float,
    postscale: float,
    compression: Any,
    sparse_as_dense: bool,
    process_set: ProcessSet,
) -> list[Any]:
    """Reduce a list of gradient tensors of the current Keras backend (``None`` stays)."""
    idx = [i for i, g in enumerate(grads) if g is not None]
    if not idx:
        return grads
    out = list(grads)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from ..tensorflow.gradient_tape import make_allreduce_grads_fn

        reduce = make_allreduce_grads_fn(
            compression=_tf_compression(compression), sparse_as_dense=sparse_as_dense, op=op,
            process_set=process_set,
        )  # fmt: skip
        if prescale != 1.0 or postscale != 1.0:
            from ..tensorflow.mpi_ops import grouped_allreduce

            ys = grouped_allreduce([grads[i] for i in idx], op=op, prescale_factor=prescale,
                                   postscale_factor=postscale, process_set=process_set)  # fmt: skip
        else:
            ys = reduce([grads[i] for i in idx])
    elif backend == "torch":  # the torch front (Keras' torch backend has torch)
        from ..torch.collectives import grouped_allreduce as torch_grouped
        from ..torch.compression import Compression as TorchCompression

        ts = [grads[i] for i in idx]
        if is_fp16(compression):
            pairs = [TorchCompression.fp16.compress(t) for t in ts]
            ys = torch_grouped([p[0] for p in pairs], op=op, prescale_factor=prescale,
                               postscale_factor=postscale, process_set=process_set)  # fmt: skip
            ys = [TorchCompression.fp16.decompress(y, p[1]) for y, p in zip(ys, pairs, strict=True)]
        else:
            ys = torch_grouped(ts, op=op, prescale_factor=prescale, postscale_factor=postscale,
                               process_set=process_set)  # fmt: skip
    elif backend == "jax":
        import jax

        vals = [grads[i] for i in idx]
        shapes = tuple(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in vals)  # type: ignore[no-untyped-call,unused-ignore]
        fp16 = is_fp16(compression)

        def host(*arrays: Any) -> tuple[np.ndarray, ...]:
            return tuple(allreduce_numpy(arrays, op, prescale, postscale, process_set, fp16))

        ys = list(jax.pure_callback(host, shapes, *vals))
    else:  # pragma: no cover - keras has no other backend with training support
        raise NotImplementedError(f"unison.keras does not support the {backend!r} backend")
    for i, y in zip(idx, ys, strict=True):
        out[i] = y
    return out


def _tf_compression(compression: Any) -> Any:
    from ..tensorflow.compression import Compression as TFCompression

    return TFCompression.fp16 if is_fp16(compression) else TFCompression.none


# added by helper "engine": what unison.keras.allgather needs without torch
def allgather_numpy(value: Any, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank's array concatenated along the first dimension."""
    a = np.asarray(value)
    out = _ops.synchronize(_ops.allgather_async(_to_buffer(a), process_set=process_set))
    return np.asarray(_to_numpy(out, a.dtype))
