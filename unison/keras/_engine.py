"""Keras 3, any backend, on the shared engine of :mod:`unison.torch`.

Values reach the engine as CPU torch tensors: directly on the torch backend,
through :mod:`unison.tensorflow` (``tf.py_function`` inside a ``tf.function``)
on the TensorFlow backend, and through ``jax.pure_callback`` inside ``jit`` on
the JAX backend. Callbacks run eagerly and go through numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import torch

from ..torch import ops as _ops
from ..torch.basics import ProcessSet, global_process_set
from ..torch.negotiation import HvdOp

__all__ = ["allreduce_grads", "allreduce_numpy", "broadcast_numpy", "is_fp16"]


def _to_torch(a: Any) -> torch.Tensor:
    a = np.array(a, copy=True)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_numpy(t: torch.Tensor, like: np.dtype) -> np.ndarray:
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(like)
    return t.numpy()


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
    ins = [_to_torch(a) for a in arrs]
    if fp16:
        ins = [t.half() if t.is_floating_point() else t for t in ins]
    out: list[np.ndarray] = [np.empty(0)] * len(arrs)
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(ins):
        groups.setdefault(t.dtype, []).append(i)
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
    hs = [_ops.broadcast_async(_to_torch(a), int(root_rank), process_set=process_set) for a in arrs]
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
    elif backend == "torch":
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
