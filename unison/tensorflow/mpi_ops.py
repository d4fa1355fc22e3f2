"""Horovod's ``horovod.tensorflow`` collectives on ``tf.Tensor``, ``tf.Variable`` and
``tf.IndexedSlices``, eager and inside ``tf.function``, with Horovod's gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ..horovod.basics import ProcessSet, global_process_set, rank
from ..horovod.negotiation import HvdOp
from ..horovod.ops import handle_average_backwards_compatibility
from . import raw
from .compression import Compression

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "reducescatter",
]

Average = HvdOp.AVERAGE
Sum = HvdOp.SUM
Adasum = HvdOp.ADASUM
Min = HvdOp.MIN
Max = HvdOp.MAX
Product = HvdOp.PRODUCT


def _one_or_list(ys: list[Any]) -> Any:
    return ys[0] if len(ys) == 1 else ys


def _float(t: Any) -> bool:
    return bool(t.dtype.is_floating or t.dtype.is_complex)


def _allreduce_diff(
    xs: list[Any],
    op: HvdOp,
    pre: float,
    post: float,
    name: str | None,
    ps: ProcessSet,
    grouped: bool,
) -> list[Any]:
    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def f(*args: Any) -> Any:
        ys = raw.allreduce(list(args), op, pre, post, name, ps, grouped)

        def grad(*dys: Any) -> Any:
            # Horovod: the gradient of an allreduce is the allreduce of the gradient
            return _one_or_list(raw.allreduce(list(dys), op, pre, post, None, ps, grouped))

        return _one_or_list(ys), grad

    out = f(*xs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Average (or ``op``) ``tensor`` over the process set. ``tf.IndexedSlices`` are
    allgathered (values and indices), as Horovod does."""
    rop = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError(
                "Pre/postscale_factor are not supported with tf.IndexedSlices"
            )
        if rop == Adasum:
            raise NotImplementedError(
                "The Adasum reduction does not currently support sparse tensors"
            )
        if rop not in (Average, Sum):
            raise NotImplementedError(
                "Only Sum and Average ops are supported with tf.IndexedSlices"
            )
        values = raw.allgather([tensor.values], name, process_set, False)[0]
        indices = raw.allgather(
            [tensor.indices], None if name is None else f"{name}.indices", process_set, False
        )[0]
        if rop == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    t = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(t)
    y = _allreduce_diff(
        [compressed], rop, prescale_factor, postscale_factor, name, process_set, False
    )[0]
    return compression.decompress(y, ctx)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    name: str | None = None,
) -> list[Any]:
    """Allreduce of several tensors negotiated and fused as one operation."""
    rop = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [
            allreduce(t, op=rop, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      compression=compression, process_set=process_set,
                      name=None if name is None else f"{name}.{k}")
            for k, t in enumerate(tensors)
        ]  # fmt: skip
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    # one request per dtype: the engine fuses tensors of one dtype
    by_dtype: dict[Any, list[int]] = {}
    for i, (c, _) in enumerate(pairs):
        by_dtype.setdefault(c.dtype, []).append(i)
    out: list[Any] = [None] * len(tensors)
    for idx in by_dtype.values():
        ys = _allreduce_diff(
            [pairs[i][0] for i in idx], rop, prescale_factor, postscale_factor, name,
            process_set, True,
        )  # fmt: skip
        for i, y in zip(idx, ys, strict=True):
            out[i] = compression.decompress(y, pairs[i][1])
    return out


def _slice_mine(g: Any, rows: Any, ps: ProcessSet) -> Any:
    """Rows of the gathered gradient ``g`` that came from this rank (``rows``: per rank)."""
    r = ps.rank()
    start = tf.reduce_sum(rows[:r])
    return g[start : start + rows[r]]


def _allgather_diff(xs: list[Any], name: str | None, ps: ProcessSet, grouped: bool) -> list[Any]:
    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def f(*args: Any) -> Any:
        ys = raw.allgather(list(args), name, ps, grouped)

        def grad(*dys: Any) -> Any:
            # Horovod: average the gradient over ranks, keep this rank's rows (one op per
            # gradient: TensorFlow may hand float32 zeros for an unused float64 output)
            gs = [raw.allreduce([dy], Average, 1.0, 1.0, None, ps, False)[0] for dy in dys]
            counts = [tf.shape(x, out_type=tf.int64)[:1] for x in args]
            rows = raw.allgather(counts, None, ps, grouped)
            return _one_or_list([_slice_mine(g, r, ps) for g, r in zip(gs, rows, strict=True)])

        return _one_or_list(ys), grad

    out = f(*xs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def allgather(
    tensor: Any,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ)."""
    return _allgather_diff([tf.convert_to_tensor(tensor)], name, process_set, False)[0]


def grouped_allgather(
    tensors: Sequence[Any],
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in tensors]
    return _allgather_diff(ts, name, process_set, True) if ts else []


def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s ``tensor`` (``root_rank`` is a global rank) on every rank."""
    root = int(root_rank)
    if process_set.ranks is not None and root not in process_set.ranks:
        raise ValueError(f"root_rank {root} is not a member of {process_set}")

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def f(x: Any) -> Any:
        y = raw.broadcast([x], root, name, process_set)[0]

        def grad(dy: Any) -> Any:
            # Horovod: the average of the gradients on the root, zeros elsewhere
            g = raw.allreduce([dy], Average, 1.0, 1.0, None, process_set, False)[0]
            return g if rank() == root else g * 0

        return y, grad

    return f(tf.convert_to_tensor(tensor))


def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send rows ``splits[j]`` of ``tensor`` to rank j (equal blocks without ``splits``).
    Returns the received rows; with ``splits``, (received rows, received splits), as
    Horovod does."""
    t = tf.convert_to_tensor(tensor)
    if splits is not None:
        splits = tf.convert_to_tensor(splits, dtype=tf.int32)

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def f(x: Any) -> Any:
        out, recv = raw.alltoall(x, splits, name, process_set)

        def grad(dout: Any, _drecv: Any = None) -> Any:
            return raw.alltoall(dout, recv, None, process_set)[0]

        return (out, recv), grad

    out, recv = f(t)
    return out if splits is None else (out, recv)


def _reducescatter_diff(
    xs: list[Any],
    op: HvdOp,
    pre: float,
    post: float,
    name: str | None,
    ps: ProcessSet,
    grouped: bool,
) -> list[Any]:
    if op not in (Average, Sum):
        raise NotImplementedError(f"reducescatter supports Sum and Average, got {op!r}")

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def f(*args: Any) -> Any:
        ys = raw.reducescatter(list(args), op, pre, post, name, ps, grouped)

        def grad(*dys: Any) -> Any:
            # every rank's input rows of block i fed rank i's output: gather the blocks back,
            # scaled as Horovod's: by the set's size for Sum, by the pre/postscale factors
            gs = [raw.allgather([dy], None, ps, False)[0] for dy in dys]
            scale = pre * post * (ps.size() if op == Sum else 1)
            return _one_or_list([g * tf.cast(scale, g.dtype) if _float(g) else g for g in gs])

        return _one_or_list(ys), grad

    out = f(*xs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = Average,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reduce over ranks, then give rank i the i-th block of rows (lower ranks get the extra)."""
    t = tf.convert_to_tensor(tensor)
    c, ctx = compression.compress(t)
    y = _reducescatter_diff(
        [c], HvdOp(int(op)), prescale_factor, postscale_factor, name, process_set, False
    )[0]
    return compression.decompress(y, ctx)


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> list[Any]:
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    if not pairs:
        return []
    ys = _reducescatter_diff(
        [c for c, _ in pairs], HvdOp(int(op)), prescale_factor, postscale_factor, name,
        process_set, True,
    )  # fmt: skip
    return [compression.decompress(y, ctx) for y, (_, ctx) in zip(ys, pairs, strict=True)]
