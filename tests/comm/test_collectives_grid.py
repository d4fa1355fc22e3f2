"""Every collective, every dtype and op, every root, odd and even world sizes, counts
0, 1, p-1, p+1, 1000 and several segments, against the numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison import ReduceOp
from unison.testing import reduce_oracle, spawn

from ._grid import DTYPES, OPS, check, counts, data, valid

SIZES = [1, 2, 3, 4, 5, 7]


def _reductions() -> int:
    p, r = un.size(), un.rank()
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not valid(op, dtype):
                continue
            for n in counts(p):
                case += 1
                ins = [data(case, k, n, dtype, op) for k in range(p)]
                want = reduce_oracle(ins, op)
                x = ins[r].copy()
                un.all_reduce(x, op=op)
                check(x, want, f"all_reduce {op.name} {np.dtype(dtype)} n={n}", op)
                root = case % p
                y = ins[r].copy()
                un.reduce(y, dst=root, op=op)
                check(y, want if r == root else ins[r], f"reduce root={root} {op.name}", op)
                outs = np.empty(n, dtype)
                mine_in = [data(case, k, n * p, dtype, op) for k in range(p)]
                un.reduce_scatter_tensor(outs, mine_in[r], op=op)
                full = reduce_oracle(mine_in, op)
                check(outs, full[r * n : (r + 1) * n], f"reduce_scatter {op.name} n={n}", op)
    return case


def _movement() -> int:
    p, r = un.size(), un.rank()
    case = 1000
    for dtype in DTYPES:
        for n in counts(p):
            case += 1
            ins = [data(case, k, n, dtype, ReduceOp.SUM) for k in range(p)]
            for root in range(p):
                b = ins[r].copy() if r == root else np.zeros(n, dtype)
                un.broadcast(b, src=root)
                check(b, ins[root], f"broadcast root={root} n={n}")
                gl = [np.empty(n, dtype) for _ in range(p)] if r == root else None
                un.gather(ins[r], gl, dst=root)
                if gl is not None:
                    for k in range(p):
                        check(gl[k], ins[k], f"gather root={root} from {k}")
                sl = [ins[k] for k in range(p)] if r == root else None
                got = np.empty(n, dtype)
                un.scatter(got, sl, src=root)
                check(got, ins[r], f"scatter root={root}")
            outs = [np.empty(n, dtype) for _ in range(p)]
            un.all_gather(outs, ins[r])
            for k in range(p):
                check(outs[k], ins[k], f"all_gather from {k} n={n}")
            flat = np.empty(n * p, dtype)
            un.all_gather_into_tensor(flat, ins[r])
            check(flat, np.concatenate(ins), f"all_gather_into_tensor n={n}")
            # all_to_all with unequal blocks: rank k sends (k + j) % 3 + n elements to j
            send = [data(case + 500 + j, r, n + (r + j) % 3, dtype, ReduceOp.SUM) for j in range(p)]
            recv = [np.empty(n + (k + r) % 3, dtype) for k in range(p)]
            un.all_to_all(recv, send)
            for k in range(p):
                check(
                    recv[k],
                    data(case + 500 + r, k, n + (k + r) % 3, dtype, ReduceOp.SUM),
                    f"all_to_all from {k}",
                )
            single_in = np.stack(
                [data(case + 900 + j, r, n, dtype, ReduceOp.SUM) for j in range(p)]
            )
            single_out = np.empty_like(single_in)
            un.all_to_all_single(single_out, single_in)
            for k in range(p):
                check(
                    single_out[k],
                    data(case + 900 + r, k, n, dtype, ReduceOp.SUM),
                    f"all_to_all_single from {k}",
                )
            un.barrier()
    return case


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", SIZES)
def test_reductions(p: int, small_segments: dict[str, str]) -> None:
    assert len(set(spawn(_reductions, p, env=small_segments, timeout=240))) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", SIZES)
def test_data_movement(p: int, small_segments: dict[str, str]) -> None:
    assert len(set(spawn(_movement, p, env=small_segments, timeout=240))) == 1


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
