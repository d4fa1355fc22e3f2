"""Horovod's ``horovod.tensorflow.util`` helpers that scripts and tests reach through
``hvd.util``: whether execution is eager, and the hashable references of variables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "_cache",
    "_executing_eagerly",
    "_make_subgraph",
    "executing_eagerly",
    "refs_to_vars",
    "vars_to_refs",
]


def executing_eagerly() -> bool:
    """True where TensorFlow runs ops at once (not while building a graph)."""
    return bool(tf.executing_eagerly())


#: Horovod's name, which scripts and tests use
_executing_eagerly = executing_eagerly


def _make_subgraph(f: Callable[..., Any]) -> Any:
    """``f`` as a ``tf.function``."""
    return tf.function(f)


def _cache(f: Callable[..., Any]) -> Callable[..., Any]:
    """Memoize ``f`` on its (hashable) arguments and the execution mode."""
    memo: dict[Any, Any] = {}

    def cached(*args: Any) -> Any:
        key = (args, _executing_eagerly())
        if key not in memo:
            memo[key] = f(*args)
        return memo[key]

    return cached


def vars_to_refs(variables: Any) -> Any:
    """Hashable references of a (nested) list of variables: tuples of ``v.ref()``."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs: Any) -> Any:
    """The variables behind :func:`vars_to_refs`'s references (lists again)."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
