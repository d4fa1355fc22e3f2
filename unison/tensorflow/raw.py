"""Collectives on ``tf.Tensor`` without gradients: each one submission to the shared
engine (grouped operations travel as one request, as in unison.torch), run by
:mod:`unison.tensorflow.runner` eagerly or in a graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ..buffers import Buffer, DType
from ..horovod import ops as _ops
from ..horovod.basics import ProcessSet
from ..horovod.negotiation import HvdOp
from ._bridge import from_buffer, graph_name, to_buffer, values_of, wait
from .results import results
from .runner import Finish, run
from .size_ops import registered

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "check_set", "reducescatter"]

#: dtypes Horovod's allgather, broadcast and alltoall move besides the reducible ones:
#: they travel as the signed integers of their width (the bytes are only moved)
_MOVED_AS = {
    tf.uint16: (np.int16, DType.INT16),
    tf.uint32: (np.int32, DType.INT32),
    tf.uint64: (np.int64, DType.INT64),
}


def check_set(ps: ProcessSet) -> None:
    """Horovod's check when an op is made: the set is registered (``ValueError``
    otherwise). Running an op on a set without this rank raises ``InvalidArgumentError``."""
    registered(ps.process_set_id)


def _rest(t: tf.Tensor) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(t.shape[1:])


def _moved_in(x: tf.Tensor) -> Buffer:
    alias = _MOVED_AS.get(x.dtype)
    if alias is None:
        return to_buffer(x)
    a = np.require(values_of(x), requirements="C").view(alias[0])
    return Buffer(a.reshape(-1), alias[1], a)


def _moved_out(b: Buffer, dtype: tf.DType) -> tf.Tensor:
    if dtype in _MOVED_AS:
        return tf.convert_to_tensor(b.array.reshape(b.shape).view(dtype.as_numpy_dtype))
    return from_buffer(b, dtype)


def allreduce(
    ts: Sequence[Any],
    op: HvdOp,
    prescale: float,
    postscale: float,
    name: str | None,
    ps: ProcessSet,
    grouped: bool,
) -> list[tf.Tensor]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    check_set(ps)
    kind = "GroupedAllreduce" if grouped else "Allreduce"
    nm = graph_name(kind, ts[0], name)

    def submit(xs: list[tf.Tensor]) -> Finish:
        ins = [to_buffer(x) for x in xs]
        outs = [results.take(b.dtype, b.shape) for b in ins]  # TensorFlow takes them as they are
        h = _ops.submit_allreduce(ins, outs, nm, op, prescale, postscale, ps, grouped)
        if grouped:
            return lambda: [results.tensor(o, x.dtype) for o, x in zip(wait(h), xs, strict=True)]
        return lambda: [results.tensor(wait(h), xs[0].dtype)]

    return run(submit, ts, [t.dtype for t in ts], [t.shape for t in ts])


def allgather(ts: Sequence[Any], name: str | None, ps: ProcessSet, grouped: bool) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    check_set(ps)
    nm = graph_name("GroupedAllgather" if grouped else "Allgather", ts[0], name)

    def submit(xs: list[tf.Tensor]) -> Finish:
        ins = [_moved_in(x) for x in xs]
        if grouped:
            h = _ops.grouped_allgather_async(ins, name=nm, process_set=ps)
            return lambda: [_moved_out(o, x.dtype) for o, x in zip(wait(h), xs, strict=True)]
        h1 = _ops.allgather_async(ins[0], name=nm, process_set=ps)
        return lambda: [_moved_out(wait(h1), xs[0].dtype)]

    return run(submit, ts, [t.dtype for t in ts], [_rest(t) for t in ts])


def broadcast(ts: Sequence[Any], root: int, name: str | None, ps: ProcessSet) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    check_set(ps)
    nm = graph_name("Broadcast", ts[0], name)

    def submit(xs: list[tf.Tensor]) -> Finish:
        hs = [
            _ops.broadcast_async(
                _moved_in(x), root, name=None if nm is None else f"{nm}.{i}", process_set=ps
            )
            for i, x in enumerate(xs)
        ]
        return lambda: [_moved_out(wait(h), x.dtype) for h, x in zip(hs, xs, strict=True)]

    return run(submit, ts, [t.dtype for t in ts], [t.shape for t in ts])


def alltoall(t: Any, splits: Any, name: str | None, ps: ProcessSet) -> tuple[Any, Any]:
    """(output, received splits); split errors raise ``InvalidArgumentError``."""
    t = tf.convert_to_tensor(t)
    check_set(ps)
    nm = graph_name("Alltoall", t, name)
    inputs = [t] if splits is None else [t, tf.convert_to_tensor(splits, dtype=tf.int32)]

    def submit(xs: list[tf.Tensor]) -> Finish:
        sp = None if len(xs) == 1 else [int(v) for v in xs[1].numpy().reshape(-1)]
        h = _ops.alltoall_async(_moved_in(xs[0]), sp, name=nm, process_set=ps)

        def finish() -> list[tf.Tensor]:
            out, recv = wait(h)
            return [_moved_out(out, xs[0].dtype), tf.convert_to_tensor(recv, tf.int32)]

        return finish

    out, recv = run(submit, inputs, [t.dtype, tf.int32], [_rest(t), tf.TensorShape([ps.size()])])
    return out, recv


def reducescatter(
    ts: Sequence[Any],
    op: HvdOp,
    prescale: float,
    postscale: float,
    name: str | None,
    ps: ProcessSet,
    grouped: bool,
) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    check_set(ps)
    nm = graph_name("GroupedReducescatter" if grouped else "Reducescatter", ts[0], name)

    def submit(xs: list[tf.Tensor]) -> Finish:
        ins = [to_buffer(x) for x in xs]
        kw: dict[str, Any] = dict(
            name=nm, op=op, process_set=ps, prescale_factor=prescale, postscale_factor=postscale
        )
        if grouped:
            h = _ops.grouped_reducescatter_async(ins, **kw)
            return lambda: [from_buffer(o, x.dtype) for o, x in zip(wait(h), xs, strict=True)]
        h1 = _ops.reducescatter_async(ins[0], **kw)
        return lambda: [from_buffer(wait(h1), xs[0].dtype)]

    return run(submit, ts, [t.dtype for t in ts], [_rest(t) for t in ts])
