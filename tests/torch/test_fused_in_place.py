"""Fused all-reduce batches reduced where the tensors lie (no fusion buffer) on the
shared-memory algorithms: results bit for bit what the rank-ordered numpy reduction and
Horovod's post-scaling give, on both algorithms, in place and not, at np=2 and 3; the
fusion buffer only where the tensors share memory or a pre-scale is asked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ._util import hvd_spawn

torch = pytest.importorskip("torch")

# element counts that put piece boundaries inside rounds and inside ranks' slices
SIZES = [1, 70_001, 3, 131_072, 0, 65_537, 250_000]


def _inputs(q: int, dt: Any, seed: int) -> list[Any]:
    gen = np.random.default_rng(seed * 100 + q)
    if dt in (torch.int32, torch.int64):
        return [torch.from_numpy(gen.integers(-50, 50, size=n)).to(dt) for n in SIZES]
    return [torch.from_numpy(gen.standard_normal(n)).to(dt) for n in SIZES]


def _post_scaled(acc: np.ndarray, f: float) -> np.ndarray:
    """Horovod's post-scaling: floats in their own precision (float16 through float32),
    integers in double precision, truncated."""
    if f == 1.0:
        return acc
    if acc.dtype == np.float16:
        return (acc.astype(np.float32) * np.float32(f)).astype(np.float16)
    if acc.dtype.kind == "f":
        scaled: np.ndarray = acc * acc.dtype.type(f)
        return scaled
    return np.trunc(acc.astype(np.float64) * f).astype(acc.dtype)


def _body() -> dict[str, Any]:
    import unison.torch as hvd
    from unison.torch.basics import engine_of

    runner = engine_of(hvd.global_process_set).runner
    r, n = hvd.rank(), hvd.size()
    cases = [
        # dtype, op, prescale, postscale, in place, shared memory between tensors
        (torch.float32, hvd.Average, 1.0, 1.0, False, False),
        (torch.float32, hvd.Sum, 1.0, 0.3, True, False),
        (torch.float64, hvd.Sum, 1.0, 1.0, True, False),
        (torch.float16, hvd.Average, 1.0, 1.0, False, False),
        (torch.int32, hvd.Average, 1.0, 1.0, True, False),
        (torch.float32, hvd.Max, 1.0, 1.0, False, False),
        (torch.float32, hvd.Sum, 0.5, 1.0, False, False),  # a pre-scale: packed
        (torch.float32, hvd.Sum, 1.0, 1.0, True, True),  # one tensor twice: packed
    ]
    out = []
    for seed, (dt, op, pre, post, inplace, alias) in enumerate(cases):
        ts = _inputs(r, dt, seed)
        if alias:
            ts[-1] = ts[1]
        p0 = runner.packed
        kw: dict[str, Any] = {"op": op, "prescale_factor": pre, "postscale_factor": post}
        if inplace:
            got = hvd.grouped_allreduce_(ts, name=f"c{seed}", **kw)
            assert all(g is t for g, t in zip(got, ts, strict=True))
        else:
            got = hvd.grouped_allreduce(ts, name=f"c{seed}", **kw)
        # the oracle: every rank's inputs, pre-scaled, reduced in rank order in the
        # dtype (float16 through numpy's float16), then post-scaled as Horovod does
        want = []
        for j in range(len(SIZES)):
            terms = []
            for q in range(n):
                x = _inputs(q, dt, seed)
                if alias:
                    x[-1] = x[1]
                a = x[j].numpy()
                terms.append(a * a.dtype.type(pre) if pre != 1.0 else a)
            acc = terms[0].copy()
            for t in terms[1:]:
                acc = np.maximum(acc, t) if op == hvd.Max else acc + t
            want.append(_post_scaled(acc, post / n if op == hvd.Average else post))
        exact = all(
            np.array_equal(g.numpy(), w) and g.dtype == dt for g, w in zip(got, want, strict=True)
        )
        out.append((seed, exact, runner.packed - p0))
    return {"cases": out}


@pytest.mark.parametrize("algo", ["shm", "shm_one"])
@pytest.mark.parametrize("np_", [2, 3])
def test_fused_batches_reduce_where_the_tensors_lie(algo: str, np_: int) -> None:
    res = hvd_spawn(_body, np_, env={"UNISON_ALGO": f"all_reduce:{algo}"}, timeout=120)
    for r in res:
        cases = r["cases"]
        assert [c[1] for c in cases] == [True] * len(cases), cases
        # the fusion buffer only for the pre-scale and the shared memory
        assert [c[2] for c in cases] == [0, 0, 0, 0, 0, 0, 1, 1], cases
