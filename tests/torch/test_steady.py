"""The steady-state blocking all-reduce (unison.horovod.steady): taken in steady state, the
same bits as the general cycle for every op, dtype and scaling, in place and not, and a
cycle whose records differ falls back to the general decision (counts, never timings)."""

from __future__ import annotations

from typing import Any

import pytest

from ._util import hvd_spawn

torch = pytest.importorskip("torch")

CASES = [
    ("float32", 0, 1.0, 1.0),  # Average
    ("float32", 1, 0.3, 1.7),  # Sum, both scalings
    ("float64", 0, 1.1, 0.9),
    ("int32", 0, 0.5, 1.0),  # integers: scaled in double precision, truncated
    ("int64", 5, 1.0, 1.0),  # Product
    ("int8", 1, 1.0, 0.5),
    ("float32", 3, 1.0, 1.0),  # Min
    ("uint8", 4, 1.0, 1.0),  # Max
]


def _run(hvd: Any, on: bool, eng: Any, rounds: int) -> list[Any]:
    import numpy as np

    steady = eng.steady
    out = []
    r = hvd.rank()
    for dt, op, pre, post in CASES:
        name = f"s.{dt}.{op}.{pre}.{post}.{on}"
        for i in range(rounds):
            eng.steady = steady if on else None
            rng = np.random.default_rng(1000 * i + 7 * r + op)
            a = torch.from_numpy(rng.integers(1, 9, size=(2, 3))).to(getattr(torch, dt))
            got = hvd.allreduce(a, name=name, op=op, prescale_factor=pre, postscale_factor=post)
            b = a.clone()
            hvd.allreduce_(b, name=name + ".ip", op=op, prescale_factor=pre, postscale_factor=post)
            out.append((got.dtype == a.dtype, got.shape == a.shape, got.tolist(), b.tolist()))
    eng.steady = steady
    return out


def _body() -> dict[str, Any]:
    import unison.torch as hvd
    from unison.torch.basics import engine_of

    eng = engine_of(hvd.global_process_set)
    if eng.steady is None:
        return {"skip": True}
    r = hvd.rank()
    general = _run(hvd, False, eng, 4)
    t0 = eng.steady.taken
    fast = _run(hvd, True, eng, 4)
    res: dict[str, Any] = {"general": general, "fast": fast, "taken": eng.steady.taken - t0}
    # differentiable: the gradient of an allreduce through the steady path
    w = torch.ones(3, requires_grad=True)
    for _ in range(4):
        y = hvd.allreduce(w * 2.0, name="grad", op=hvd.Sum)
        y.sum().backward()
    res["grad"] = w.grad.tolist()
    # records that differ: rank 0 calls 'a' then 'b' blocking; the others submit 'b' and 'a'
    # together; rank 0's steady 'a' meets a record with two bits: the general decision runs
    # 'a' in that cycle ('b' on the next), no rank waits on a promise
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    fb0 = eng.steady.fell_back
    res["lane_before"] = eng.state.gathered_next
    if r == 0:
        ga = hvd.allreduce(torch.ones(1), name="a", op=hvd.Sum)
        gb = hvd.allreduce(torch.ones(2), name="b", op=hvd.Sum)
    else:
        hb = hvd.allreduce_async(torch.ones(2), name="b", op=hvd.Sum)
        ha = hvd.allreduce_async(torch.ones(1), name="a", op=hvd.Sum)
        ga, gb = hvd.synchronize(ha), hvd.synchronize(hb)
    res["ab"] = (ga.tolist(), gb.tolist())
    # the same again, both names cached now and every rank steady: rank 0's steady 'a'
    # meets the others' records of 'a' and 'b' and falls back to the general decision
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    if r == 0:
        ga = hvd.allreduce(torch.ones(1), name="a", op=hvd.Sum)
        gb = hvd.allreduce(torch.ones(2), name="b", op=hvd.Sum)
    else:
        hb = hvd.allreduce_async(torch.ones(2), name="b", op=hvd.Sum)
        ha = hvd.allreduce_async(torch.ones(1), name="a", op=hvd.Sum)
        ga, gb = hvd.synchronize(ha), hvd.synchronize(hb)
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    res["ab2"] = (ga.tolist(), gb.tolist())
    res["fell_back"] = eng.steady.fell_back - fb0
    return res


@pytest.mark.parametrize("np_", [2, 3])
def test_steady_path_same_bits_and_fallback(np_: int) -> None:
    outs = hvd_spawn(_body, np_, timeout=120)
    if outs[0].get("skip"):
        pytest.skip("no slot lane on this engine")
    for r, o in enumerate(outs):
        assert o["fast"] == o["general"], r
        # every case: the first call is negotiated, the next is not gathered yet; the rest
        # (2 per case, out of place and in place each) take the steady path
        assert o["taken"] >= len(CASES) * 2 * 2, o["taken"]
        assert all(x[0] and x[1] for x in o["fast"])
        assert o["grad"] == [float(4 * 2 * np_)] * 3
        assert o["ab"] == ([float(np_)], [float(np_)] * 2)
        assert o["ab2"] == ([float(np_)], [float(np_)] * 2)
    assert outs[0]["fell_back"] >= 1
