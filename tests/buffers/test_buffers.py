"""Adapters, dtype table and reduction kernels, in one process."""

from __future__ import annotations

import numpy as np
import pytest

from unison import ReduceOp
from unison.buffers import DType, as_buffer, check_op, finalize_average, kernel
from unison.errors import InvalidArgumentError
from unison.testing import reduce_oracle


def test_numpy_views_share_memory() -> None:
    a = np.zeros((3, 4), np.float32)
    b = as_buffer(a)
    b.array[5] = 7
    assert a[1, 1] == 7 and b.count == 12 and b.dtype is DType.FLOAT32 and b.shape == (3, 4)


@pytest.mark.parametrize(
    "bad,text",
    [
        (np.zeros((4, 4))[:, 0], "contiguous"),
        (np.zeros(3, np.complex128), "unsupported dtype"),
        (np.zeros(3, ">f4"), "unsupported dtype"),
        ([1.0, 2.0], "numpy array or a torch tensor"),
    ],
)
def test_bad_buffers(bad: object, text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=text):
        as_buffer(bad)


def test_read_only_buffer_rejected_only_when_written() -> None:
    a = np.zeros(3)
    a.flags.writeable = False
    as_buffer(a, writable=False)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        as_buffer(a)


DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.bool_,
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [o for o in ReduceOp if o is not ReduceOp.AVG])
def test_kernels_match_the_oracle(dtype: type, op: ReduceOp) -> None:
    d = as_buffer(np.zeros(1, dtype)).dtype
    if op.is_bitwise and d.is_floating:
        with pytest.raises(InvalidArgumentError, match="integer or bool"):
            check_op(op, d)
        return
    rng = np.random.default_rng(0)
    a = (rng.random(64) < 0.5) if dtype is np.bool_ else rng.integers(1, 5, 64).astype(dtype)
    b = (rng.random(64) < 0.5) if dtype is np.bool_ else rng.integers(1, 5, 64).astype(dtype)
    out = a.copy()
    kernel(op, d)(out, b, out)
    assert np.array_equal(out, reduce_oracle([a, b], op))


def test_integer_average_truncates_toward_zero() -> None:
    a = np.array([7, -7, 5, -5, 0], np.int32)
    finalize_average(a, DType.INT32, 2)
    assert a.tolist() == [3, -3, 2, -2, 0]


def test_torch_tensors_and_bfloat16() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.bfloat16)
    b = as_buffer(t)
    assert b.dtype is DType.BFLOAT16 and b.array.dtype == np.int16
    other = torch.ones(6, dtype=torch.bfloat16)
    kernel(ReduceOp.SUM, DType.BFLOAT16)(b.array, as_buffer(other).array, b.array)
    assert torch.equal(t, torch.arange(6, dtype=torch.bfloat16) + 1)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        as_buffer(torch.zeros(4, 4).t())


def test_device_tensors_pass_only_where_the_engine_moves_them() -> None:
    torch = pytest.importorskip("torch")
    from unison.errors import UnsupportedError

    t = torch.zeros(3, 4, device="meta")  # a non-CPU tensor that needs no GPU
    with pytest.raises(UnsupportedError, match="backend='torch'"):
        as_buffer(t)
    b = as_buffer(t, device_ok=True)
    assert b.on_device and b.count == 12 and b.nbytes == 48 and b.source is t
    assert not as_buffer(torch.zeros(2)).on_device


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    "dtype,code",
    [(np.float16, DType.FLOAT16), (np.float32, DType.FLOAT32), (np.float64, DType.FLOAT64)],
)
def test_float_kernels_overflow_silently(dtype: type, code: DType) -> None:
    """A float reduction that overflows gives inf (or nan for inf + -inf) without
    numpy's RuntimeWarning, as Gloo and MPI reduce; the error state is restored."""
    big = np.finfo(dtype).max
    for n in (3, 5000):  # small and large arrays
        a = np.full(n, big, dtype)
        out = np.empty_like(a)
        kernel(ReduceOp.SUM, code)(a, a, out)
        assert np.isposinf(out).all()
        kernel(ReduceOp.PRODUCT, code)(a, -a, out)
        assert np.isneginf(out).all()
        kernel(ReduceOp.SUM, code)(out, -out, out)
        assert np.isnan(out).all()
    with pytest.raises(RuntimeWarning, match="overflow"):
        np.add(a, a)  # outside the kernel numpy's own state is untouched


def _overflow_all_reduce() -> list[float]:
    import warnings

    import unison as un

    warnings.simplefilter("error")
    x = np.full(4, np.finfo(np.float32).max, np.float32)
    un.all_reduce(x)  # SUM over 2 ranks
    y = np.full(3000, np.finfo(np.float32).max, np.float32)
    un.all_reduce(y)
    assert np.isposinf(y).all()
    return [float(v) for v in x]


@pytest.mark.timeout(60)
def test_overflowing_all_reduce_is_silent() -> None:
    from unison.testing import spawn

    for got in spawn(_overflow_all_reduce, 2, timeout=50):
        assert got == [float("inf")] * 4
