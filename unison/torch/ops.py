"""Submitting operations: validation on the caller's thread, then the engine.

Every ``*_async`` function here returns a :class:`Handle` at once; the engine
runs the operation in the background. ``poll`` never blocks; ``synchronize``
returns the operation's result (the output tensor, a list for grouped ops, a
pair for alltoall) or raises its error on every rank that submitted it.
"""

from __future__ import annotations

import itertools
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .basics import ProcessSet, engine_of, global_process_set, settings
from .errors import HorovodInternalError
from .handle import Entry, Handle
from .negotiation import HvdOp, RequestKind, TensorRequest, parse_splits

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
    "grouped_allgather_async",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "handle_average_backwards_compatibility",
    "join",
    "poll",
    "reducescatter_async",
    "synchronize",
]

Average = HvdOp.AVERAGE
Sum = HvdOp.SUM
Adasum = HvdOp.ADASUM
Min = HvdOp.MIN
Max = HvdOp.MAX
Product = HvdOp.PRODUCT

_SUPPORTED = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
}
_names: dict[int | None, itertools.count[int]] = {}
_names_lock = threading.Lock()
_tls = threading.local()  # .blocking: the next submission is waited on at once


def handle_average_backwards_compatibility(op: Any, average: Any) -> HvdOp:
    """Horovod's rule: ``op`` wins; the deprecated ``average=`` maps to Average/Sum."""
    if op is not None:
        if average is not None:
            raise ValueError(
                "The op parameter supersedes average. Please provide only one of them."
            )
        try:
            return HvdOp(int(op))
        except (TypeError, ValueError):
            raise ValueError(f"unknown reduction op {op!r}") from None
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed",
            DeprecationWarning,
            stacklevel=3,
        )
        return HvdOp.AVERAGE if average else HvdOp.SUM
    return HvdOp.AVERAGE


def reset_generated_names() -> None:
    """Restart the generated-name counters (``hvd.shutdown()`` does, so every rank of the
    next world, new or surviving, counts from 0)."""
    with _names_lock:
        _names.clear()


def _auto_name(kind: str, name: str | None, ps: ProcessSet) -> str:
    """``name``, or the next generated one; counted per process set, so ranks that run
    the same operations on a set generate the same names whatever else they run."""
    if name is not None:
        return str(name)
    with _names_lock:
        counter = _names.setdefault(ps.process_set_id, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def _check(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}; unison.torch moves CPU tensors only")
    if t.dtype not in _SUPPORTED:
        raise ValueError(f"Tensor type {t.dtype} is not supported.")
    if t.is_sparse:
        raise ValueError(f"{what} is sparse; use sparse_allreduce_async or sparse_as_dense")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return t


def _submit(
    ps: ProcessSet,
    req: TensorRequest,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor] | None,
    finish: Callable[[Entry, Any], Any],
) -> Handle:
    engine = engine_of(ps)
    handle = Handle(req.name, keep=(inputs, outputs), engine=engine)
    entry = Entry(req, inputs, outputs, handle, finish)
    if getattr(_tls, "blocking", False):
        _tls.blocking = False
        engine.run_blocking(entry)  # an idle engine: this thread runs the cycle
    else:
        engine.submit(entry)
    return handle


def blocking(fn: Callable[..., Handle], *args: Any, **kwargs: Any) -> Any:
    """``synchronize(fn(*args, **kwargs))`` for an ``*_async`` function ``fn``; when the engine is
    idle the negotiation and execution run on this thread (no hand-off to the engine)."""
    _tls.blocking = True
    try:
        handle = fn(*args, **kwargs)
    finally:
        _tls.blocking = False
    return synchronize(handle)


def _first(_: Entry, produced: Any) -> Any:
    return produced[0]


def _all(_: Entry, produced: Any) -> Any:
    return list(produced)


def _same(_: Entry, produced: Any) -> Any:
    return produced


# --- allreduce --------------------------------------------------------------------------------
def _allreduce(
    tensors: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    name: str | None,
    op: HvdOp,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    grouped: bool,
) -> Handle:
    ts = [_check(t, "allreduce tensor") for t in tensors]
    engine_of(process_set)
    if not ts:
        raise ValueError("grouped_allreduce needs at least one tensor")
    if len({t.dtype for t in ts}) != 1:
        raise ValueError("all tensors of a grouped allreduce must have one dtype")
    if op == HvdOp.ADASUM and not ts[0].is_floating_point():
        raise ValueError("Adasum needs floating-point tensors")
    if op == HvdOp.ADASUM and process_set is not global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    req = TensorRequest(
        _auto_name("grouped_allreduce" if grouped else "allreduce", name, process_set),
        RequestKind.ALLREDUCE,
        str(ts[0].dtype),
        tuple(tuple(t.shape) for t in ts),
        int(op),
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return _submit(process_set, req, ts, list(outputs), _all if grouped else _first)


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
    t = _check(tensor, "allreduce tensor")
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
    t = _check(tensor, "allreduce tensor")
    return _allreduce([t], [t], name, rop, prescale_factor, postscale_factor, process_set, False)


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
    ts = [_check(t, "allreduce tensor") for t in tensors]
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
    ts = [_check(t, "allreduce tensor") for t in tensors]
    return _allreduce(ts, ts, name, rop, prescale_factor, postscale_factor, process_set, True)


def _check_grouped(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    """Tensors of a (grouped) allgather/reducescatter: at least one, each of at least one
    dimension, all of one dtype."""
    ts = [_check(t, f"{what} tensor") for t in tensors]
    if not ts:
        raise ValueError(f"grouped_{what} needs at least one tensor")
    for t in ts:
        if t.dim() == 0:
            raise ValueError(f"{what} needs tensors of at least one dimension")
    if len({t.dtype for t in ts}) != 1:
        raise ValueError(f"all tensors of a grouped {what} must have one dtype")
    return ts


# --- allgather ----------------------------------------------------------------------------------
def _allgather(
    tensors: Sequence[torch.Tensor], name: str | None, ps: ProcessSet, grouped: bool
) -> Handle:
    ts = _check_grouped(tensors, "allgather")
    engine_of(ps)
    req = TensorRequest(
        _auto_name("grouped_allgather" if grouped else "allgather", name, ps),
        RequestKind.ALLGATHER,
        str(ts[0].dtype),
        tuple(tuple(t.shape) for t in ts),
    )
    return _submit(ps, req, ts, None, _all if grouped else _first)


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
def _broadcast(
    t: torch.Tensor, out: torch.Tensor, root_rank: int, name: str | None, ps: ProcessSet
) -> Handle:
    t = _check(t, "broadcast tensor")
    engine_of(ps)  # registered, and this rank a member: checked before anything else
    root = operator.index(root_rank)
    if ps.ranks is not None and root not in ps.ranks:
        raise ValueError(f"root_rank {root} is not a member of {ps}")
    if ps.ranks is None and not 0 <= root < ps.size():
        raise ValueError(f"root_rank {root} is out of range: the job has ranks 0..{ps.size() - 1}")
    req = TensorRequest(
        _auto_name("broadcast", name, ps),
        RequestKind.BROADCAST,
        str(t.dtype),
        (tuple(t.shape),),
        root=root,
    )
    return _submit(ps, req, [t], [out], _first)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Copy ``tensor`` of ``root_rank`` (a global rank) to a new tensor on every rank."""
    t = _check(tensor, "broadcast tensor")
    return _broadcast(t, torch.empty_like(t), root_rank, name, process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    t = _check(tensor, "broadcast tensor")
    return _broadcast(t, t, root_rank, name, process_set)


# --- alltoall -------------------------------------------------------------------------------------
def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Send rows ``splits[j]`` of ``tensor`` to rank j; synchronize gives (output, splits)."""
    t = _check(tensor, "alltoall tensor")
    engine_of(process_set)  # registered, and this rank a member: checked before anything else
    n = process_set.size()
    if t.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    if splits is None:
        if t.shape[0] % n:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even "
                "multiple of the number of workers."
            )
        sp = [t.shape[0] // n] * n
    else:
        sp = parse_splits(splits)
        if len(sp) != n:
            raise ValueError("Number of entries in splits does not equal number of workers.")
        if any(x < 0 for x in sp):
            raise ValueError(f"alltoall: splits {sp} must not be negative")
        if sum(sp) > t.shape[0]:
            raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
        if sum(sp) < t.shape[0]:  # Horovod sends the first sum(splits) rows only
            t = t[: sum(sp)]
    req = TensorRequest(
        _auto_name("alltoall", name, process_set),
        RequestKind.ALLTOALL,
        str(t.dtype),
        (tuple(t.shape),),
        splits=tuple(sp),
    )
    recv_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    return _submit(process_set, req, [t], None, lambda _e, out: (out[0], out[1].to(recv_dtype)))


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
    rop = HvdOp.AVERAGE if op is None else HvdOp(int(op))
    if rop == HvdOp.ADASUM:
        raise NotImplementedError("reducescatter does not support Adasum")
    ts = _check_grouped(tensors, "reducescatter")
    engine_of(ps)
    req = TensorRequest(
        _auto_name("grouped_reducescatter" if grouped else "reducescatter", name, ps),
        RequestKind.REDUCESCATTER,
        str(ts[0].dtype),
        tuple(tuple(t.shape) for t in ts),
        int(rop),
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return _submit(ps, req, ts, None, _all if grouped else _first)


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


# --- control ----------------------------------------------------------------------------------
def poll(handle: Handle) -> bool:
    """True once the operation finished (``synchronize`` will not block)."""
    if not isinstance(handle, Handle):
        raise ValueError(f"not a handle of an unison.torch operation: {handle!r}")
    return handle.done()


def synchronize(handle: Any) -> Any:
    """Wait for an operation; return its output (or raise its error)."""
    if callable(handle) and not isinstance(handle, Handle):
        return handle()  # sparse allreduce handles
    if not isinstance(handle, Handle):
        raise ValueError(f"not a handle of an unison.torch operation: {handle!r}")
    s = settings()
    return handle.wait(s.timeout)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set reaches the barrier."""
    engine_of(process_set)
    req = TensorRequest(_auto_name("barrier", None, process_set), RequestKind.BARRIER)
    blocking(_submit, process_set, req, [], None, _same)


def join(device: int = -1) -> int:
    """This rank is out of data: it contributes zeros to every allreduce the others run
    until all ranks have joined. Returns the rank that joined last."""
    req = TensorRequest("__join__", RequestKind.JOIN)
    h = _submit(global_process_set, req, [], None, _same)
    # as in Horovod, join blocks until every rank has joined, however long the others
    # train: the deadline restarts whenever the engine completes another negotiation
    # cycle (the others are still running collectives); a lost peer fails it at once
    engine = engine_of(global_process_set)
    timeout = settings().timeout
    while True:
        cycle = engine.cycles
        try:
            return int(h.wait(timeout))
        except HorovodInternalError:
            if h.done() or engine.cycles == cycle:
                raise
