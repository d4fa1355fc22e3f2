"""Horovod's ``*_async`` API on torch tensors: the front end of the engine.

Each function checks its tensors (CPU, dense, contiguous, a supported dtype), views
them as buffers without copying (:func:`buffer_of`) and submits them to the engine
(:mod:`unison.horovod.ops`); results come back as torch tensors: the tensors given
(in-place forms, outputs made here with ``empty_like``) or tensors sharing the
memory of the engine's new result buffers. ``poll`` never blocks; ``synchronize``
returns the operation's result (the output tensor, a list for grouped ops, a pair for
alltoall) or raises its error on every rank that submitted it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..buffers import Buffer, DType
from ..horovod import ops as _engine_ops
from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.handle import Entry, Handle
from ..horovod.ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    barrier,
    blocking,
    handle_average_backwards_compatibility,
    join,
    poll,
    reset_generated_names,
    synchronize,
)

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather_async",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "barrier",
    "blocking",
    "broadcast_async",
    "broadcast_async_",
    "buffer_of",
    "check",
    "grouped_allgather_async",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "handle_average_backwards_compatibility",
    "join",
    "poll",
    "reducescatter_async",
    "reset_generated_names",
    "synchronize",
    "tensor_of",
]

_DTYPES = {
    torch.uint8: DType.UINT8,
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.int64: DType.INT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.bool: DType.BOOL,
}


def check(t: Any, what: str) -> torch.Tensor:
    """``t`` if the engine can move it, else Horovod's error for it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}; unison.torch moves CPU tensors only")
    if t.dtype not in _DTYPES:
        raise ValueError(f"Tensor type {t.dtype} is not supported.")
    if t.is_sparse:
        raise ValueError(f"{what} is sparse; use sparse_allreduce_async or sparse_as_dense")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return t


def buffer_of(t: torch.Tensor) -> Buffer:
    """A checked tensor's memory as a flat buffer (no copy; its source: ``t``)."""
    dt = _DTYPES[t.dtype]
    d = t.detach()
    if dt is DType.BFLOAT16:
        d = d.view(torch.int16)
    return Buffer(d.numpy().reshape(-1), dt, t)


def tensor_of(b: Buffer) -> torch.Tensor:
    """The tensor a result buffer stands for: the tensor it views, or a tensor sharing
    the memory of a buffer the engine made."""
    src = b.source
    if isinstance(src, torch.Tensor):
        return src
    t = torch.from_numpy(np.asarray(src))
    return t.view(torch.bfloat16) if b.dtype is DType.BFLOAT16 else t


def _first(_: Entry, produced: Any) -> Any:
    return tensor_of(produced[0])


def _all(_: Entry, produced: Any) -> Any:
    return [tensor_of(b) for b in produced]


def _buffers(tensors: Sequence[torch.Tensor]) -> list[Buffer]:
    return [buffer_of(t) for t in tensors]


# --- allreduce --------------------------------------------------------------------------------
def _allreduce(
    ts: list[torch.Tensor],
    outs: list[torch.Tensor],
    name: str | None,
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    grouped: bool,
) -> Handle:
    ins = _buffers(ts)
    # in place: the very same buffers, so the engine sees there is nothing to copy
    obufs = ins if outs is ts else _buffers(outs)
    return _engine_ops.submit_allreduce(
        ins,
        obufs,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        grouped,
        _all if grouped else _first,
        keep=(ts, outs),
    )


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Average (or ``op``) ``tensor`` over the process set into a new tensor, in the background."""
    rop = handle_average_backwards_compatibility(op, average)
    t = check(tensor, "allreduce tensor")
    return _allreduce(
        [t], [torch.empty_like(t)], name, rop, prescale_factor, postscale_factor, process_set, False
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """In-place :func:`allreduce_async`."""
    rop = handle_average_backwards_compatibility(op, average)
    ts = [check(tensor, "allreduce tensor")]
    return _allreduce(ts, ts, name, rop, prescale_factor, postscale_factor, process_set, False)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    rop = handle_average_backwards_compatibility(op, average)
    ts = [check(t, "allreduce tensor") for t in tensors]
    return _allreduce(
        ts,
        [torch.empty_like(t) for t in ts],
        name,
        rop,
        prescale_factor,
        postscale_factor,
        process_set,
        True,
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    rop = handle_average_backwards_compatibility(op, average)
    ts = [check(t, "allreduce tensor") for t in tensors]
    return _allreduce(ts, ts, name, rop, prescale_factor, postscale_factor, process_set, True)


# --- allgather ----------------------------------------------------------------------------------
def _allgather(
    tensors: Sequence[torch.Tensor], name: str | None, ps: ProcessSet, grouped: bool
) -> Handle:
    ts = [check(t, "allgather tensor") for t in tensors]
    return _engine_ops.submit_allgather(
        _buffers(ts), name, ps, grouped, _all if grouped else _first, keep=ts
    )


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Concatenate every rank's ``tensor`` along dimension 0 (first dims may differ)."""
    return _allgather([tensor], name, process_set, False)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    return _allgather(list(tensors), name, process_set, True)


# --- broadcast ----------------------------------------------------------------------------------
def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Copy ``tensor`` of ``root_rank`` (a global rank) to a new tensor on every rank."""
    t = check(tensor, "broadcast tensor")
    out = torch.empty_like(t)
    return _engine_ops.submit_broadcast(
        buffer_of(t), buffer_of(out), root_rank, name, process_set, _first, keep=(t, out)
    )


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    t = check(tensor, "broadcast tensor")
    b = buffer_of(t)
    return _engine_ops.submit_broadcast(b, b, root_rank, name, process_set, _first, keep=t)


# --- alltoall -------------------------------------------------------------------------------------
def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Send rows ``splits[j]`` of ``tensor`` to rank j; synchronize gives (output, splits)."""
    t = check(tensor, "alltoall tensor")
    recv_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def finish(_: Entry, produced: Any) -> Any:
        out, received = produced
        return tensor_of(out), torch.from_numpy(received).to(recv_dtype)

    return _engine_ops.submit_alltoall(buffer_of(t), splits, name, process_set, finish, keep=t)


# --- reducescatter --------------------------------------------------------------------------------
def _reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None,
    op: Any,
    ps: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
    grouped: bool,
) -> Handle:
    ts = [check(t, "reducescatter tensor") for t in tensors]
    return _engine_ops.submit_reducescatter(
        _buffers(ts),
        name,
        op,
        ps,
        prescale_factor,
        postscale_factor,
        grouped,
        _all if grouped else _first,
        keep=ts,
    )


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Reduce over ranks, then give rank i the i-th block of rows (lower ranks get the extra)."""
    return _reducescatter([tensor], name, op, process_set, prescale_factor, postscale_factor, False)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    return _reducescatter(
        list(tensors), name, op, process_set, prescale_factor, postscale_factor, True
    )
