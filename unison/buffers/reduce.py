"""The one reduce-and-scale rule: reduce in rank order, then scale.

:func:`reduce_and_scale` (and :func:`reducer`, the same made once per signature for
hot paths) is how every engine of unison combines the ranks' blocks: ``parts[0] op
parts[1] op ...`` in rank order (the same bytes on every rank), then AVG divides by
the number of parts, then an optional factor scales the result; integers are divided
and scaled with truncation toward zero; numpy's floating-point warnings are silenced.

Underneath are the reduction kernels: numpy ufuncs writing into preallocated buffers (``out=``).

A kernel is ``kernel(a, b, out)`` computing ``out = a (op) b`` elementwise on
storage-typed 1-D arrays; ``out`` may alias ``a``. No array is allocated per call
(bfloat16 goes through torch views, also without copies).

Float kernels are silent when a result overflows to inf (or an inf meets -inf), as
Gloo's and MPI's reductions are: numpy's floating-point error state is set to
"ignore" for the one call. ``np.errstate`` costs about a microsecond per call, a
large share of a small all_reduce, so on numpy 2 the kernel sets numpy's error-state
context variable directly to a state built once (a set and a reset, ~0.1 us);
where that hook is missing it falls back to ``np.errstate``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._types import ReduceOp
from ..errors import InvalidArgumentError
from .dtypes import DType

__all__ = [
    "Kernel",
    "Reducer",
    "check_op",
    "finalize_average",
    "kernel",
    "reduce_and_scale",
    "reducer",
    "scale_in_place",
]

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
#: ``reducer(parts, out)``: ``out`` = the parts reduced in rank order (see :func:`reducer`)
Reducer = Callable[[Sequence[np.ndarray], np.ndarray], None]

_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

_BOOL_UFUNC = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}


def _quiet_state() -> tuple[Any, Any] | None:
    """numpy 2's error-state context variable and an all-"ignore" state for it."""
    try:
        from numpy._core.umath import _extobj_contextvar, _make_extobj
    except ImportError:  # numpy 1.x, or the internals moved: np.errstate instead
        return None
    with np.errstate(all="ignore"):
        return _extobj_contextvar, _make_extobj()


_QUIET = _quiet_state()


def _silent(ufunc: Callable[..., Any]) -> Kernel:
    """``ufunc(a, b, out=out)`` with floating-point warnings off for that call."""
    if _QUIET is None:

        def run_errstate(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            with np.errstate(all="ignore"):
                ufunc(a, b, out=out)

        return run_errstate
    var, state = _QUIET

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        token = var.set(state)
        try:
            ufunc(a, b, out=out)
        finally:
            var.reset(token)

    return run


def check_op(op: ReduceOp, dtype: DType) -> None:
    """Raise InvalidArgumentError if ``op`` cannot reduce ``dtype``."""
    if op.is_bitwise and not dtype.is_bitwise_ok:
        raise InvalidArgumentError(
            f"reduce op {op.name} needs an integer or bool buffer, got {dtype.label}"
        )
    if op is ReduceOp.AVG and dtype is DType.BOOL:
        raise InvalidArgumentError("reduce op AVG is undefined for bool buffers")


def _bf16_kernel(op: ReduceOp) -> Kernel:
    import torch

    fn: Any = {
        ReduceOp.SUM: torch.add,
        ReduceOp.AVG: torch.add,
        ReduceOp.PRODUCT: torch.mul,
        ReduceOp.MIN: torch.minimum,
        ReduceOp.MAX: torch.maximum,
    }[op]

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        ta = torch.from_numpy(a).view(torch.bfloat16)
        tb = torch.from_numpy(b).view(torch.bfloat16)
        fn(ta, tb, out=torch.from_numpy(out).view(torch.bfloat16))

    return run


def kernel(op: ReduceOp, dtype: DType) -> Kernel:
    """The elementwise kernel for ``op`` on ``dtype`` (validated by :func:`check_op`)."""
    check_op(op, dtype)
    if dtype is DType.BFLOAT16:
        return _bf16_kernel(op)
    ufunc = _BOOL_UFUNC[op] if dtype is DType.BOOL else _UFUNC[op]
    if dtype.is_floating:
        return _silent(ufunc)  # integers wrap silently already

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        ufunc(a, b, out=out)

    return run


def finalize_average(arr: np.ndarray, dtype: DType, size: int) -> None:
    """Divide a summed buffer by ``size`` in place (integers truncate toward zero)."""
    if size == 1 or arr.shape[0] == 0:
        return
    if dtype is DType.BFLOAT16:
        import torch

        t = torch.from_numpy(arr).view(torch.bfloat16)
        t.div_(size)
    elif dtype.is_floating:
        np.divide(arr, arr.dtype.type(size), out=arr)
    else:
        neg = arr < 0
        np.abs(arr, out=arr)
        np.floor_divide(arr, size, out=arr)
        np.negative(arr, out=arr, where=neg)


def reducer(op: ReduceOp, dtype: DType, parts: int) -> Reducer:
    """``run(srcs, out)``: ``out`` = ``srcs[0] op srcs[1] op ...`` in rank order, AVG then
    divided by ``parts`` (integers truncated toward zero). Made once per call signature
    (the hot paths keep it); ``len(srcs) == parts``; ``out`` may be ``srcs[0]`` itself,
    not a later block. Validates ``op`` for ``dtype`` (:func:`check_op`)."""
    kern = kernel(op, dtype)
    if parts == 1:

        def one(srcs: Sequence[np.ndarray], out: np.ndarray) -> None:
            if out is not srcs[0]:
                out[...] = srcs[0]

        return one
    if parts == 2 and op is not ReduceOp.AVG:

        def two(srcs: Sequence[np.ndarray], out: np.ndarray) -> None:
            kern(srcs[0], srcs[1], out)

        return two

    def many(srcs: Sequence[np.ndarray], out: np.ndarray) -> None:
        kern(srcs[0], srcs[1], out)
        for s in srcs[2:]:
            kern(out, s, out)
        if op is ReduceOp.AVG:
            finalize_average(out.reshape(-1), dtype, parts)

    return many


def scale_in_place(arr: np.ndarray, dtype: DType, factor: float) -> None:
    """Multiply ``arr`` by ``factor`` in place: floats directly (warnings silenced),
    integers in float64 and truncated toward zero; bool is left as it is."""
    if factor == 1.0 or arr.size == 0 or dtype is DType.BOOL:
        return
    if dtype is DType.BFLOAT16:
        import torch

        torch.from_numpy(arr).view(torch.bfloat16).mul_(factor)
    elif dtype.is_floating:
        _silent(np.multiply)(arr, arr.dtype.type(factor), arr)
    else:
        scaled = arr.astype(np.float64) * factor
        np.trunc(scaled, out=scaled)
        arr[...] = scaled.astype(arr.dtype)  # C semantics of a truncating cast


def reduce_and_scale(
    parts: Sequence[np.ndarray],
    out: np.ndarray,
    op: ReduceOp,
    dtype: DType | None = None,
    scale: float = 1.0,
) -> None:
    """``out`` = ``parts`` reduced in rank order (AVG: divided by ``len(parts)``), then
    multiplied by ``scale`` (:func:`scale_in_place`). ``parts`` are equal-shaped arrays
    of one dtype (``dtype``: what they hold, default from their numpy dtype; give
    ``DType.BFLOAT16`` for bfloat16 storage); ``out`` may be ``parts[0]``."""
    if not parts:
        raise InvalidArgumentError("reduce_and_scale needs at least one part")
    dt = dtype if dtype is not None else _dtype_of(parts[0])
    reducer(ReduceOp(op), dt, len(parts))(parts, out)
    scale_in_place(out, dt, scale)


def _dtype_of(arr: np.ndarray) -> DType:
    from .dtypes import from_numpy

    dt = from_numpy(arr.dtype)
    if dt is None:
        raise InvalidArgumentError(f"reduce_and_scale: unsupported dtype {arr.dtype}")
    return dt
