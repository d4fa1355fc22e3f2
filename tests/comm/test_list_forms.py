"""The list forms of all_gather (outputs as a list) and reduce_scatter (inputs as a list)
on the caller-thread path: a validated signature's later calls run without the full
validation, with the numpy oracle's results, and anything that differs from the
validated signature is validated again (and refused before anything runs)."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison.testing import reduce_oracle, spawn

pytestmark = pytest.mark.timeout(120)


def _inp(q: int, step: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) % 7 + 3 * q + step).astype(dtype)


def _list_forms() -> list[object]:
    r, p = un.rank(), un.size()
    world = un.get_world_group()
    bad: list[object] = []
    for shape, dtype in [((2,), np.float32), ((3, 2), np.int64), ((1,), np.float64)]:
        outs = [np.zeros(shape, dtype) for _ in range(p)]
        ins = [np.zeros(shape, dtype) for _ in range(p)]
        rs_out = np.zeros(shape, dtype)
        for step in range(5):  # the first call validates and prepares, the rest reuse it
            mine = _inp(r, step, shape, dtype)
            un.all_gather(outs, mine)
            for q in range(p):
                if not np.array_equal(outs[q], _inp(q, step, shape, dtype)):
                    bad.append(("all_gather", shape, step, q, outs[q].tolist()))
            for q in range(p):  # rank r's block for q: distinct per (r, q)
                ins[q][...] = _inp(r, step + 10 * q, shape, dtype)
            un.reduce_scatter(rs_out, ins, op=un.ReduceOp.SUM)
            want = reduce_oracle(
                [_inp(s, step + 10 * r, shape, dtype) for s in range(p)], un.ReduceOp.SUM
            )
            if not np.array_equal(rs_out, want):
                bad.append(("reduce_scatter", shape, step, rs_out.tolist(), want.tolist()))
    # the plain signature is the one later calls find before validating
    ct = world.caller_thread
    assert ct is not None
    from unison._types import OpCode

    prepared = [
        (OpCode.ALL_GATHER, "list", np.dtype(np.float32), (2,)) in ct.calls,
        (OpCode.REDUCE_SCATTER, "list", np.dtype(np.float32), (2,), un.ReduceOp.SUM) in ct.calls,
    ]
    # after the fast path, what differs is validated again and refused before running
    x = np.ones(2, np.float32)
    errors = []
    for outs_bad in (
        [np.zeros(2, np.float64), np.zeros(2, np.float32)],  # a block of another dtype
        [np.zeros(3, np.float32), np.zeros(2, np.float32)],  # of another size
        [np.zeros(2, np.float32)],  # too few
    ):
        try:
            un.all_gather(outs_bad[::-1] if r else outs_bad, x)
            errors.append("accepted")
        except un.InvalidArgumentError as exc:
            errors.append(str(exc).split(" ")[0])
    frozen = np.zeros(2, np.float32)
    frozen.flags.writeable = False
    try:
        un.all_gather([np.zeros(2, np.float32), frozen], x)
        errors.append("accepted")
    except un.InvalidArgumentError as exc:
        errors.append(str(exc).split(" ")[0])
    try:
        un.reduce_scatter(np.zeros(2, np.float32), [x, np.ones(2, np.int32)])
        errors.append("accepted")
    except un.InvalidArgumentError as exc:
        errors.append(str(exc).split(" ")[0])
    # a non-contiguous block (whose reshape would copy: the result lost) is refused too
    wide = [np.zeros((2, 2), np.float32)[:, 0] for _ in range(p)]
    try:
        un.all_gather(wide, x)
        errors.append("accepted")
    except un.InvalidArgumentError as exc:
        errors.append(str(exc).split(" ")[0])
    # the group is still in step: one more call agrees on every rank
    y = np.full(2, r + 1.0, np.float32)
    un.all_reduce(y)
    return [bad, prepared, errors, y.tolist()]


def test_list_forms_reuse_the_validated_call_and_match_the_oracle() -> None:
    outs = spawn(_list_forms, 2, env={"UNISON_TIMEOUT": "60"}, timeout=100)
    for r, (bad, prepared, errors, y) in enumerate(outs):
        assert bad == [], (r, bad)
        assert prepared == [True, True], r
        assert errors == ["all_gather"] * 4 + ["reduce_scatter", "all_gather"], (r, errors)
        assert y == [3.0, 3.0], r
