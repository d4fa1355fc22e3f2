"""The numpy oracle: what a reduction over ranks must give, computed in one process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._types import ReduceOp

__all__ = ["reduce_oracle"]


def reduce_oracle(arrays: Sequence[np.ndarray], op: ReduceOp) -> Any:
    """Reduce ``arrays`` (one per rank) with ``op`` the way unison defines it."""
    a = np.stack([np.asarray(x) for x in arrays])
    if a.dtype == np.bool_:
        fn = {
            ReduceOp.SUM: np.any,
            ReduceOp.MAX: np.any,
            ReduceOp.BOR: np.any,
            ReduceOp.PRODUCT: np.all,
            ReduceOp.MIN: np.all,
            ReduceOp.BAND: np.all,
        }.get(op)
        if fn is not None:
            return fn(a, axis=0)
        if op is ReduceOp.BXOR:
            return np.logical_xor.reduce(a, axis=0)
    if op is ReduceOp.SUM:
        return a.sum(axis=0, dtype=a.dtype)
    if op is ReduceOp.AVG:
        if np.issubdtype(a.dtype, np.floating):
            return (a.astype(np.float64).sum(axis=0) / len(arrays)).astype(a.dtype)
        s = a.sum(axis=0, dtype=a.dtype)
        return (np.sign(s) * (np.abs(s) // len(arrays))).astype(a.dtype)
    if op is ReduceOp.PRODUCT:
        return a.prod(axis=0, dtype=a.dtype)
    if op is ReduceOp.MIN:
        return a.min(axis=0)
    if op is ReduceOp.MAX:
        return a.max(axis=0)
    ufunc = {
        ReduceOp.BAND: np.bitwise_and,
        ReduceOp.BOR: np.bitwise_or,
        ReduceOp.BXOR: np.bitwise_xor,
    }[op]
    return ufunc.reduce(a, axis=0)
