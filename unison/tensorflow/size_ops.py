"""Horovod's ``*_op`` queries: the process's topology as ``tf.Tensor`` (int32)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..horovod import basics as _b

__all__ = [
    "registered",
    "cross_rank_op",
    "cross_size_op",
    "local_rank_op",
    "local_size_op",
    "process_set_included_op",
    "rank_op",
    "size_op",
]


def registered(process_set_id: Any) -> Any:
    """The registered process set of id ``process_set_id`` (``ValueError`` if none is)."""
    return _b.process_set_by_id(process_set_id)


def _set(process_set_id: int) -> Any:
    return _b.process_set_by_id(process_set_id)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return tf.constant(registered(process_set_id).size(), tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(_b.rank(), tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(_b.local_size(), tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(_b.local_rank(), tf.int32, name=name)


def cross_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(_b.cross_size(), tf.int32, name=name)


def cross_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(_b.cross_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return tf.constant(int(registered(process_set_id).included()), tf.int32, name=name)
