"""Shared case generation for the collective grid: each rank can rebuild any rank's
input from (case, rank), so every child checks against the numpy oracle locally."""

from __future__ import annotations

import numpy as np

from unison import ReduceOp

DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int32,
    np.int64,
    np.int8,
    np.int16,
    np.uint8,
    np.bool_,
]
OPS = list(ReduceOp)


def counts(p: int) -> list[int]:
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000, 2600})


def valid(op: ReduceOp, dtype: type) -> bool:
    floating = np.issubdtype(dtype, np.floating)
    if op.is_bitwise and floating:
        return False
    if op is ReduceOp.AVG and dtype is np.bool_:
        return False
    return True


def data(case: int, rank: int, n: int, dtype: type, op: ReduceOp) -> np.ndarray:
    rng = np.random.default_rng([case, rank])
    if dtype is np.bool_:
        return rng.random(n) < 0.5
    if op is ReduceOp.PRODUCT:
        if np.issubdtype(dtype, np.floating):
            return rng.choice(np.array([1.0, 2.0, 0.5, -1.0]), n).astype(dtype)
        return rng.choice(
            np.array([1, 2, -1, 3])
            if np.issubdtype(dtype, np.signedinteger)
            else np.array([1, 2, 3]),
            n,
        ).astype(dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(0, 40, n).astype(dtype)
    return rng.integers(-20, 20, n).astype(dtype)


def check(got: np.ndarray, want: np.ndarray, what: str, op: ReduceOp | None = None) -> None:
    if op is ReduceOp.AVG and np.issubdtype(got.dtype, np.floating):
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.flatnonzero(got != want)[:5]
        raise AssertionError(f"{what}: differs at {bad.tolist()}: got {got[bad]} want {want[bad]}")
