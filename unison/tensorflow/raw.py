"""Collectives on ``tf.Tensor`` without gradients: each one submission to the shared
engine (grouped operations travel as one request, as in unison.torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ..horovod import ops as _ops
from ..horovod.basics import ProcessSet
from ..horovod.negotiation import HvdOp
from ._bridge import from_buffer, graph_name, run, to_buffer, wait

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "reducescatter"]


def _rest(t: tf.Tensor) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(t.shape[1:])


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
    kind = "GroupedAllreduce" if grouped else "Allreduce"
    nm = graph_name(kind, ts[0], name)

    def fn(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        ins = [to_buffer(x) for x in xs]
        if grouped:
            h = _ops.grouped_allreduce_async(
                ins, name=nm, op=op, prescale_factor=prescale, postscale_factor=postscale,
                process_set=ps,
            )  # fmt: skip
            outs = wait(h)
        else:
            h = _ops.allreduce_async(
                ins[0], name=nm, op=op, prescale_factor=prescale, postscale_factor=postscale,
                process_set=ps,
            )  # fmt: skip
            outs = [wait(h)]
        return [from_buffer(o, x.dtype) for o, x in zip(outs, xs, strict=True)]

    return run(fn, ts, [t.dtype for t in ts], [t.shape for t in ts])


def allgather(ts: Sequence[Any], name: str | None, ps: ProcessSet, grouped: bool) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    nm = graph_name("GroupedAllgather" if grouped else "Allgather", ts[0], name)

    def fn(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        ins = [to_buffer(x) for x in xs]
        if grouped:
            outs = wait(_ops.grouped_allgather_async(ins, name=nm, process_set=ps))
        else:
            outs = [wait(_ops.allgather_async(ins[0], name=nm, process_set=ps))]
        return [from_buffer(o, x.dtype) for o, x in zip(outs, xs, strict=True)]

    return run(fn, ts, [t.dtype for t in ts], [_rest(t) for t in ts])


def broadcast(ts: Sequence[Any], root: int, name: str | None, ps: ProcessSet) -> list[Any]:
    ts = [tf.convert_to_tensor(t) for t in ts]
    nm = graph_name("Broadcast", ts[0], name)

    def fn(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        hs = [
            _ops.broadcast_async(
                to_buffer(x), root, name=None if nm is None else f"{nm}.{i}", process_set=ps
            )
            for i, x in enumerate(xs)
        ]
        return [from_buffer(wait(h), x.dtype) for h, x in zip(hs, xs, strict=True)]

    return run(fn, ts, [t.dtype for t in ts], [t.shape for t in ts])


def alltoall(t: Any, splits: Any, name: str | None, ps: ProcessSet) -> tuple[Any, Any]:
    t = tf.convert_to_tensor(t)
    nm = graph_name("Alltoall", t, name)
    inputs = [t] if splits is None else [t, tf.convert_to_tensor(splits, dtype=tf.int32)]

    def fn(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        sp = None if len(xs) == 1 else [int(v) for v in xs[1].numpy().reshape(-1)]
        out, recv = wait(_ops.alltoall_async(to_buffer(xs[0]), sp, name=nm, process_set=ps))
        return [from_buffer(out, xs[0].dtype), tf.convert_to_tensor(recv, tf.int32)]

    out, recv = run(fn, inputs, [t.dtype, tf.int32], [_rest(t), tf.TensorShape([ps.size()])])
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
    nm = graph_name("GroupedReducescatter" if grouped else "Reducescatter", ts[0], name)

    def fn(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        ins = [to_buffer(x) for x in xs]
        kw: dict[str, Any] = dict(
            name=nm, op=op, process_set=ps, prescale_factor=prescale, postscale_factor=postscale
        )
        if grouped:
            outs = wait(_ops.grouped_reducescatter_async(ins, **kw))
        else:
            outs = [wait(_ops.reducescatter_async(ins[0], **kw))]
        return [from_buffer(o, x.dtype) for o, x in zip(outs, xs, strict=True)]

    return run(fn, ts, [t.dtype for t in ts], [_rest(t) for t in ts])
