"""Submitting operations on buffers: Horovod's ``*_async`` API, framework-neutral.

Every ``*_async`` function validates on the caller's thread and returns a
:class:`~unison.horovod.handle.Handle` at once; the engine runs the operation in the
background. ``poll`` never blocks; ``synchronize`` returns the operation's result or
raises its error on every rank that submitted it.

Buffers are :class:`unison.buffers.Buffer` views (or numpy arrays, viewed as one).
Results are buffers too: the outputs given (in-place forms), or new numpy-backed
ones. A front end (``unison.torch``, ``unison.tensorflow``, ``unison.keras``) checks
its tensors, views them as buffers without copying, and passes ``finish``: what turns
the engine's result buffers into its own tensors (on the thread that completes the
operation).
"""

from __future__ import annotations

import itertools
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..buffers import Buffer, as_buffer
from .arrays import new_buffer
from .basics import ProcessSet, engine_of, global_process_set, settings
from .errors import HorovodInternalError
from .handle import Entry, Handle
from .negotiation import HvdOp, RequestKind, TensorRequest, parse_splits

__all__ = [
    "Adasum",
    "Average",
    "Finish",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather_async",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "as_buffers",
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
    "reset_generated_names",
    "submit_allgather",
    "submit_allreduce",
    "submit_alltoall",
    "submit_broadcast",
    "submit_reducescatter",
    "synchronize",
    "to_numpy",
]

Average = HvdOp.AVERAGE
Sum = HvdOp.SUM
Adasum = HvdOp.ADASUM
Min = HvdOp.MIN
Max = HvdOp.MAX
Product = HvdOp.PRODUCT

#: turns what the engine produced (a list of result buffers, a pair for alltoall, an
#: int for join) into what ``synchronize`` returns
Finish = Callable[[Entry, Any], Any]

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


def as_buffers(items: Sequence[Any], what: str) -> list[Buffer]:
    """Buffers, or numpy arrays viewed as buffers (read-only arrays are fine: the engine
    writes only into outputs it made or was given)."""
    return [as_buffer(x, what, writable=False) for x in items]


def _first(_: Entry, produced: Any) -> Any:
    return produced[0]


def _all(_: Entry, produced: Any) -> Any:
    return list(produced)


def _same(_: Entry, produced: Any) -> Any:
    return produced


def _submit(
    ps: ProcessSet,
    req: TensorRequest,
    inputs: list[Buffer],
    outputs: list[Buffer] | None,
    finish: Finish,
    keep: Any = None,
) -> Handle:
    engine = engine_of(ps)
    handle = Handle(req.name, keep=keep, engine=engine)
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


# --- the requests (validated buffers in, a handle out) -------------------------------------
def submit_allreduce(
    ins: list[Buffer],
    outs: list[Buffer],
    name: str | None,
    op: HvdOp,
    prescale_factor: float,
    postscale_factor: float,
    ps: ProcessSet,
    grouped: bool,
    finish: Finish | None = None,
    keep: Any = None,
) -> Handle:
    """Reduce ``ins`` into ``outs`` (the same buffers: in place)."""
    engine_of(ps)
    if not ins:
        raise ValueError("grouped_allreduce needs at least one tensor")
    if len({b.dtype for b in ins}) != 1:
        raise ValueError("all tensors of a grouped allreduce must have one dtype")
    if op == HvdOp.ADASUM and not ins[0].dtype.is_floating:
        raise ValueError("Adasum needs floating-point tensors")
    if op == HvdOp.ADASUM and ps is not global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    req = TensorRequest(
        _auto_name("grouped_allreduce" if grouped else "allreduce", name, ps),
        RequestKind.ALLREDUCE,
        ins[0].dtype.label,
        tuple(b.shape for b in ins),
        int(op),
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    done = finish or (_all if grouped else _first)
    return _submit(ps, req, ins, outs, done, keep)


def _check_grouped(bufs: list[Buffer], what: str) -> list[Buffer]:
    """Buffers of a (grouped) allgather/reducescatter: at least one, each of at least one
    dimension, all of one dtype."""
    if not bufs:
        raise ValueError(f"grouped_{what} needs at least one tensor")
    for b in bufs:
        if len(b.shape) == 0:
            raise ValueError(f"{what} needs tensors of at least one dimension")
    if len({b.dtype for b in bufs}) != 1:
        raise ValueError(f"all tensors of a grouped {what} must have one dtype")
    return bufs


def submit_allgather(
    bufs: list[Buffer],
    name: str | None,
    ps: ProcessSet,
    grouped: bool,
    finish: Finish | None = None,
    keep: Any = None,
) -> Handle:
    _check_grouped(bufs, "allgather")
    engine_of(ps)
    req = TensorRequest(
        _auto_name("grouped_allgather" if grouped else "allgather", name, ps),
        RequestKind.ALLGATHER,
        bufs[0].dtype.label,
        tuple(b.shape for b in bufs),
    )
    return _submit(ps, req, bufs, None, finish or (_all if grouped else _first), keep)


def submit_broadcast(
    b: Buffer,
    out: Buffer,
    root_rank: int,
    name: str | None,
    ps: ProcessSet,
    finish: Finish | None = None,
    keep: Any = None,
) -> Handle:
    engine_of(ps)  # registered, and this rank a member: checked before anything else
    root = operator.index(root_rank)
    if ps.ranks is not None and root not in ps.ranks:
        raise ValueError(f"root_rank {root} is not a member of {ps}")
    if ps.ranks is None and not 0 <= root < ps.size():
        raise ValueError(f"root_rank {root} is out of range: the job has ranks 0..{ps.size() - 1}")
    req = TensorRequest(
        _auto_name("broadcast", name, ps),
        RequestKind.BROADCAST,
        b.dtype.label,
        (b.shape,),
        root=root,
    )
    return _submit(ps, req, [b], [out], finish or _first, keep)


def submit_alltoall(
    b: Buffer,
    splits: Any,
    name: str | None,
    ps: ProcessSet,
    finish: Finish | None = None,
    keep: Any = None,
) -> Handle:
    """Rows ``splits[j]`` of ``b`` to rank j; the result is (output buffer, the rows
    received from each rank as int32)."""
    engine_of(ps)  # registered, and this rank a member: checked before anything else
    n = ps.size()
    shape = b.shape
    if len(shape) == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    if splits is None:
        if shape[0] % n:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even "
                "multiple of the number of workers."
            )
        sp = [shape[0] // n] * n
    else:
        sp = parse_splits(splits)
        if len(sp) != n:
            raise ValueError("Number of entries in splits does not equal number of workers.")
        if any(x < 0 for x in sp):
            raise ValueError(f"alltoall: splits {sp} must not be negative")
        if sum(sp) > shape[0]:
            raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
        if sum(sp) < shape[0]:  # Horovod sends the first sum(splits) rows only
            rows = sum(sp)
            width = b.count // shape[0] if shape[0] else 0
            head = b.array[: rows * width]
            b = Buffer(head, b.dtype, head.reshape((rows, *shape[1:])))
    req = TensorRequest(
        _auto_name("alltoall", name, ps),
        RequestKind.ALLTOALL,
        b.dtype.label,
        (b.shape,),
        splits=tuple(sp),
    )
    return _submit(ps, req, [b], None, finish or _same, keep)


def submit_reducescatter(
    bufs: list[Buffer],
    name: str | None,
    op: Any,
    ps: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
    grouped: bool,
    finish: Finish | None = None,
    keep: Any = None,
) -> Handle:
    rop = HvdOp.AVERAGE if op is None else HvdOp(int(op))
    if rop == HvdOp.ADASUM:
        raise NotImplementedError("reducescatter does not support Adasum")
    _check_grouped(bufs, "reducescatter")
    engine_of(ps)
    req = TensorRequest(
        _auto_name("grouped_reducescatter" if grouped else "reducescatter", name, ps),
        RequestKind.REDUCESCATTER,
        bufs[0].dtype.label,
        tuple(b.shape for b in bufs),
        int(rop),
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return _submit(ps, req, bufs, None, finish or (_all if grouped else _first), keep)


# --- Horovod's names on buffers ---------------------------------------------------------------
def allreduce_async(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Average (or ``op``) a buffer over the process set into a new buffer."""
    rop = handle_average_backwards_compatibility(op, average)
    (b,) = as_buffers([tensor], "allreduce tensor")
    out = new_buffer(b.dtype, b.shape)
    return submit_allreduce(
        [b], [out], name, rop, prescale_factor, postscale_factor, process_set, False
    )


def allreduce_async_(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """In-place :func:`allreduce_async` (the buffer must be writable)."""
    rop = handle_average_backwards_compatibility(op, average)
    b = as_buffer(tensor, "allreduce tensor")
    return submit_allreduce(
        [b], [b], name, rop, prescale_factor, postscale_factor, process_set, False
    )


def grouped_allreduce_async(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    rop = handle_average_backwards_compatibility(op, average)
    bs = as_buffers(tensors, "allreduce tensor")
    outs = [new_buffer(b.dtype, b.shape) for b in bs]
    return submit_allreduce(
        bs, outs, name, rop, prescale_factor, postscale_factor, process_set, True
    )


def grouped_allreduce_async_(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    rop = handle_average_backwards_compatibility(op, average)
    bs = [as_buffer(t, "allreduce tensor") for t in tensors]
    return submit_allreduce(bs, bs, name, rop, prescale_factor, postscale_factor, process_set, True)


def allgather_async(
    tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Concatenate every rank's buffer along dimension 0 (first dims may differ)."""
    return submit_allgather(as_buffers([tensor], "allgather tensor"), name, process_set, False)


def grouped_allgather_async(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    return submit_allgather(as_buffers(tensors, "allgather tensor"), name, process_set, True)


def broadcast_async(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """``root_rank``'s buffer (a global rank) as a new buffer on every rank."""
    (b,) = as_buffers([tensor], "broadcast tensor")
    return submit_broadcast(b, new_buffer(b.dtype, b.shape), root_rank, name, process_set)


def broadcast_async_(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    b = as_buffer(tensor, "broadcast tensor")
    return submit_broadcast(b, b, root_rank, name, process_set)


def alltoall_async(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Rows ``splits[j]`` to rank j; synchronize gives (output buffer, int32 splits)."""
    (b,) = as_buffers([tensor], "alltoall tensor")
    return submit_alltoall(b, splits, name, process_set)


def reducescatter_async(
    tensor: Any,
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Reduce over ranks, then give rank i the i-th block of rows (lower ranks get the extra)."""
    bs = as_buffers([tensor], "reducescatter tensor")
    return submit_reducescatter(bs, name, op, process_set, prescale_factor, postscale_factor, False)


def grouped_reducescatter_async(
    tensors: Sequence[Any],
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    bs = as_buffers(tensors, "reducescatter tensor")
    return submit_reducescatter(bs, name, op, process_set, prescale_factor, postscale_factor, True)


# --- control ----------------------------------------------------------------------------------
def poll(handle: Handle) -> bool:
    """True once the operation finished (``synchronize`` will not block)."""
    if not isinstance(handle, Handle):
        raise ValueError(f"not a handle of a Horovod operation: {handle!r}")
    return handle.done()


def synchronize(handle: Any) -> Any:
    """Wait for an operation; return its output (or raise its error)."""
    if callable(handle) and not isinstance(handle, Handle):
        return handle()  # sparse allreduce handles
    if not isinstance(handle, Handle):
        raise ValueError(f"not a handle of a Horovod operation: {handle!r}")
    return handle.wait(settings().timeout)


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


def to_numpy(b: Buffer) -> np.ndarray:
    """A result buffer as a numpy array of its shape (its storage type: bfloat16 comes
    as int16 storage)."""
    return b.array.reshape(b.shape)
