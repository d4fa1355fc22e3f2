"""Every collective, every dtype and op, every root, odd and even world sizes, counts
0, 1, p-1, p+1, 1000 and several segments, against the numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison import ReduceOp
from unison.testing import reduce_oracle, spawn

from ._grid import check, data, movement, reductions

SIZES = [1, 2, 3, 4, 5, 7]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", SIZES)
def test_reductions(p: int, small_segments: dict[str, str]) -> None:
    assert len(set(spawn(reductions, p, env=small_segments, timeout=240))) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", SIZES)
def test_data_movement(p: int, small_segments: dict[str, str]) -> None:
    assert len(set(spawn(movement, p, env=small_segments, timeout=240))) == 1


@pytest.mark.timeout(200)
@pytest.mark.parametrize("algo", ["all_reduce:ring", "all_reduce:recursive_doubling"])
@pytest.mark.parametrize("p", [2, 3, 5, 7])
def test_forced_allreduce_algorithms(p: int, algo: str) -> None:
    def body() -> None:
        r = un.rank()
        for n in (0, 1, p - 1, p + 1, 1000, 5000):
            for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
                ins = [data(n, k, n, np.float64, op) for k in range(p)]
                x = ins[r].copy()
                un.all_reduce(x, op=op)
                check(x, reduce_oracle(ins, op), f"{algo} {op.name} n={n}", op)

    spawn(body, p, env={"UNISON_ALGO": algo, "UNISON_SEGMENT_BYTES": "512"}, timeout=150)
