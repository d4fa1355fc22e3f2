"""Whole-model helpers: broadcast variables and Python objects."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.functions import allgather_object, broadcast_object
from . import raw

__all__ = [
    "allgather_object",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
]


def broadcast_variables(
    variables: Iterable[Any],
    root_rank: int,
    process_set: ProcessSet = global_process_set,
    inplace: bool = False,
) -> Any:
    """Assign ``root_rank``'s values to every rank's ``variables``; in a graph, the op that
    does so."""
    vs = [v for v in variables if v is not None]
    if not vs:
        return None if tf.executing_eagerly() else tf.no_op()
    values = raw.broadcast([tf.convert_to_tensor(v) for v in vs], int(root_rank), None, process_set)
    assigns = [v.assign(x) for v, x in zip(vs, values, strict=True)]
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_(
    variables: Iterable[Any],
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """In-place broadcast of ``variables`` (Horovod's ``broadcast_``): the variables'
    values read after the broadcast. In a graph those reads depend on the broadcast, so
    evaluating them runs it (as Horovod's in-place op does)."""
    vs = list(variables)
    op = broadcast_variables(vs, root_rank, process_set)
    if op is None:  # eager: the variables hold the root's values already
        return [v.read_value() for v in vs]
    with tf.control_dependencies([op]):
        return [v.read_value() for v in vs]


def broadcast_global_variables(root_rank: int) -> Any:
    """The op that gives every rank ``root_rank``'s global variables (a ``tf.compat.v1``
    graph only; eagerly, broadcast the model's variables with ``broadcast_variables``)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object_fn(
    root_rank: int = 0,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """A function ``f(obj)`` that returns ``root_rank``'s ``obj`` on every rank."""
    base = name or "broadcast_object_fn"

    def bcast(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, name=base, process_set=process_set)

    return bcast
