"""The one reduce-and-scale rule (buffers/reduce.py) against a numpy oracle, in one process."""

from __future__ import annotations

import warnings
from functools import reduce

import numpy as np
import pytest

from unison import ReduceOp
from unison.buffers import DType, from_name, from_numpy, reduce_and_scale, reducer
from unison.errors import InvalidArgumentError

_UF = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BXOR: np.bitwise_xor,
}


def _parts(p: int, dtype: type) -> list[np.ndarray]:
    rng = np.random.default_rng(p)
    return [rng.integers(-9, 10, 37).astype(dtype) for _ in range(p)]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX])
def test_reduce_in_rank_order(p: int, dtype: type, op: ReduceOp) -> None:
    parts = _parts(p, dtype)
    out = np.empty_like(parts[0])
    reduce_and_scale(parts, out, op)
    assert np.array_equal(out, reduce(lambda a, b: _UF[op](a, b), parts))


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_average_divides_and_truncates_integers(p: int) -> None:
    ints = _parts(p, np.int64)
    out = ints[0].copy()
    reduce_and_scale([out, *ints[1:]], out, ReduceOp.AVG)  # out may be the first part
    total = np.sum(ints, axis=0)
    assert np.array_equal(out, np.trunc(total / p).astype(np.int64))
    floats = _parts(p, np.float64)
    got = np.empty_like(floats[0])
    reduce_and_scale(floats, got, ReduceOp.AVG)
    assert np.allclose(got, np.sum(floats, axis=0) / p)


def test_scale_after_reducing() -> None:
    ints = [np.array([7, -7, 5, 0], np.int32), np.array([0, 0, 0, 1], np.int32)]
    out = np.empty(4, np.int32)
    reduce_and_scale(ints, out, ReduceOp.SUM, scale=0.5)
    assert out.tolist() == [3, -3, 2, 0]  # truncated toward zero
    f = [np.array([1.0, 2.0], np.float32)] * 3
    fo = np.empty(2, np.float32)
    reduce_and_scale(f, fo, ReduceOp.AVG, scale=4.0)
    assert fo.tolist() == [4.0, 8.0]
    b = [np.array([True, False]), np.array([False, False])]
    bo = np.empty(2, bool)
    reduce_and_scale(b, bo, ReduceOp.SUM, scale=3.0)
    assert bo.tolist() == [True, False]


def test_bitwise_and_float_warnings() -> None:
    ints = _parts(3, np.int16)
    out = np.empty_like(ints[0])
    reduce_and_scale(ints, out, ReduceOp.BXOR, DType.INT16)
    assert np.array_equal(out, ints[0] ^ ints[1] ^ ints[2])
    with pytest.raises(InvalidArgumentError, match="integer or bool"):
        reduce_and_scale(_parts(2, np.float32), np.empty(37, np.float32), ReduceOp.BXOR)
    big = [np.full(3, 6e4, np.float16)] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow to inf is silent, as in the engines
        o16 = np.empty(3, np.float16)
        reduce_and_scale(big, o16, ReduceOp.SUM, scale=2.0)
    assert np.isinf(o16).all()


def test_reducer_made_once_is_reused() -> None:
    run = reducer(ReduceOp.SUM, DType.FLOAT64, 3)
    for k in range(3):
        parts = _parts(3, np.float64)
        out = np.empty(37)
        run([q + k for q in parts], out)
        assert np.array_equal(out, np.sum(parts, axis=0) + 3 * k)


def test_one_dtype_table_for_every_frameworks_names() -> None:
    for code in DType:
        assert from_name(code.label) is code
        assert from_name(f"torch.{code.label}") is code
    assert from_name("tf.float32") is DType.FLOAT32 and from_name("bool_") is DType.BOOL
    assert from_name("torch.half") is DType.FLOAT16 and from_name("double") is DType.FLOAT64
    assert from_name("complex64") is None and from_name("torch.qint8") is None
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"):
        assert from_name(name) is from_numpy(np.dtype(name))
