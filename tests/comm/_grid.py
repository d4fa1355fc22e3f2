"""The collective grid: every collective, dtype, op and root, list and tensor forms, counts
across the segment thresholds, against the numpy oracle. Each rank can rebuild any rank's
input from (case, rank), so every child checks locally.

:func:`reductions` and :func:`movement` run on whichever engine the job was started on
(native, torch, mpi); ``python tests/comm/_grid.py ENGINE`` runs both, for ``mpirun``.
"""

from __future__ import annotations

import sys

import numpy as np

import unison as un
from unison import ReduceOp
from unison.testing import reduce_oracle

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
    if _engine() == "torch" and dtype is np.bool_ and op in (ReduceOp.SUM, ReduceOp.PRODUCT):
        return False  # gloo has no boolean sum or product (UnsupportedError, tested)
    return True


def _engine() -> str:
    return str(un.get_world_group().backend.name) if un.is_initialized() else "native"


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


#: the representative part of the grid, for engines run at several sizes in CI: a float
#: of each width class, a signed and an unsigned integer, bool
QUICK_DTYPES = [np.float32, np.float16, np.int64, np.uint8, np.bool_]


def reductions(dtypes: list[type] | None = None) -> int:
    p, r = un.size(), un.rank()
    case = 0
    for dtype in dtypes or DTYPES:
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
                # the list form: block j of every rank's list is reduced onto rank j
                blocks = [data(case + 7000 + j, r, n, dtype, op) for j in range(p)]
                got = np.empty(n, dtype)
                un.reduce_scatter(got, blocks, op=op)
                mine = reduce_oracle([data(case + 7000 + r, k, n, dtype, op) for k in range(p)], op)
                check(got, mine, f"reduce_scatter list {op.name} {np.dtype(dtype)} n={n}", op)
    return case


def movement(dtypes: list[type] | None = None) -> int:
    p, r = un.size(), un.rank()
    case = 1000
    for dtype in dtypes or DTYPES:
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


if __name__ == "__main__":  # under mpirun: python tests/comm/_grid.py mpi [quick]
    un.init(backend=sys.argv[1] if len(sys.argv) > 1 else None)
    chosen = QUICK_DTYPES if sys.argv[2:] == ["quick"] else None
    try:
        done = reductions(chosen), movement(chosen)
    finally:
        rank, size = un.rank(), un.size()
        un.shutdown()
    print(f"grid rank {rank}/{size} OK {done[0]}+{done[1]} cases", flush=True)
