"""Steady-state cycles gathered as records in one collective (unison/horovod/record.py), on
real ranks: the same results and decisions as point to point (oracle), the fallback for
messages that do not fit, a rank idle past the deadline, stall warnings, async submissions
in different orders, process sets and shutdown, and a peer lost inside a gathered cycle.
Counts only, never timings."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from ._util import hvd_outcomes, hvd_spawn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)


def _steady() -> dict[str, Any]:
    import warnings

    import unison.torch as hvd
    from unison.torch.basics import engine_of

    eng = engine_of(hvd.global_process_set)
    r, n = hvd.rank(), hvd.size()
    if not eng.gathered.ok:
        return {"skip": True}
    out: dict[str, Any] = {"bad": []}
    # 1. a steady loop across dtypes and ops: every later cycle is gathered, results exact
    rng = np.random.default_rng(11)
    cases = [
        (torch.float32, hvd.Sum),
        (torch.float64, hvd.Average),
        (torch.int32, hvd.Max),
        (torch.int64, hvd.Product),
        (torch.uint8, hvd.Min),
    ]
    lane0, sent0 = eng.counts["gathered"], eng.counts["control_sent"]
    for dt, op in cases:
        for i in range(6):
            vals = rng.integers(1, 4, size=(n, 3))  # the same draws on every rank
            got = hvd.allreduce(torch.from_numpy(vals[r]).to(dt), name=f"s.{dt}", op=op)
            v = vals.astype(np.float64)
            want = {
                hvd.Sum: v.sum(0),
                hvd.Average: v.mean(0),
                hvd.Max: v.max(0),
                hvd.Product: v.prod(0),
                hvd.Min: v.min(0),
            }[op]
            if got.dtype != dt or not np.allclose(got.double().numpy(), want):
                out["bad"].append((str(dt), int(op), i, got.tolist(), want.tolist()))
    out["lane"] = eng.counts["gathered"] - lane0
    out["sent"] = eng.counts["control_sent"] - sent0
    # 2. a new name and one too big to ride along while gathered: sent point to point
    hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    fresh = hvd.allreduce(torch.full((2,), float(r)), name="fresh", op=hvd.Sum)
    big = hvd.allreduce(torch.full((600,), float(r)), name="big", op=hvd.Sum)
    out["fresh"] = fresh.tolist()
    out["big"] = sorted(set(big.tolist()))
    # 3. async submissions in different orders while the next cycle is gathered
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
        names = [f"a{i}" for i in range(5)]
        if r % 2:
            names.reverse()
        hs = {
            m: hvd.allreduce_async(torch.full((2,), float(m[1:])), name=m, op=hvd.Sum)
            for m in names
        }
        out.setdefault("orders", []).append(
            [hvd.synchronize(hs[f"a{i}"]).tolist() for i in range(5)]
        )
    # 4. a rank idle for longer than UNISON_TIMEOUT while its peers wait in a gathered cycle
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    lane1 = eng.counts["gathered"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if r == n - 1:
            time.sleep(3.5)  # UNISON_TIMEOUT is 2 s in this job
            late = hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
        else:  # the peers' engines wait in gathered cycles (no user-level deadline)
            h = hvd.allreduce_async(torch.ones(1), name="warm", op=hvd.Sum)
            while not hvd.poll(h):
                time.sleep(0.02)
            late = hvd.synchronize(h)
    out["late"] = late.tolist()
    out["late_lane"] = eng.counts["gathered"] - lane1
    out["stall"] = [str(w.message) for w in caught if "stall" in str(w.message)]
    # 5. a process set of two ranks in steady state, then removed (its goodbye is gathered)
    ps = hvd.add_process_set([0, n - 1])
    if ps.included():
        pe = engine_of(ps)
        for i in range(5):
            s = hvd.allreduce(torch.tensor([float(r + i)]), name="ps", op=hvd.Sum, process_set=ps)
            if s.item() != float(n - 1 + 2 * i):
                out["bad"].append(("ps", i, s.item()))
        out["ps_lane"] = pe.counts["gathered"]
    hvd.remove_process_set(ps)
    # leave in steady state: the global set's goodbye travels in a gathered cycle too
    # (a rank slowed by the machine can stall 'warm' for a while: the stall warnings' cycles
    # are not steady, so go on until every rank agrees on the same count of calls)
    for i in range(20):
        hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
        done = i >= 2 and eng.state.gathered_next
        if hvd.allreduce(torch.tensor([float(done)]), name="warm.done", op=hvd.Min).item():
            break
    out["last_lane"] = eng.state.gathered_next
    return out


def test_gathered_cycles_np3() -> None:
    env = {
        "UNISON_TIMEOUT": "2",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
    }
    outs = hvd_spawn(_steady, 3, env=env, timeout=100)
    if outs[0].get("skip"):
        pytest.skip("no slot lane on this engine")
    n = 3
    for r, o in enumerate(outs):
        assert o["bad"] == [], (r, o["bad"])
        # 5 signatures x 6 calls: the first of each is negotiated point to point, and so
        # is the one after it (its predecessor was not steady yet); the rest are gathered
        assert o["lane"] >= 5 * 4, o
        assert o["fresh"] == [float(sum(range(n)))] * 2
        assert o["big"] == [float(sum(range(n)))]
        assert o["orders"] == [[[float(i * n)] * 2 for i in range(5)]] * 3
        assert o["late"] == [float(n)] and o["late_lane"] >= 1
        assert o["last_lane"] is True
    assert outs[0]["ps_lane"] >= 1 and outs[n - 1]["ps_lane"] >= 1
    # rank 0 (the coordinator) warned about the idle rank, with Horovod's stall text
    assert any("missing on ranks [2]" in s for s in outs[0]["stall"]), outs[0]["stall"]


def _dies_in_steady_state() -> None:
    import os

    import unison.torch as hvd
    from unison.torch.basics import engine_of

    eng = engine_of(hvd.global_process_set)
    for _ in range(5):
        hvd.allreduce(torch.ones(1), name="steady")
    if eng.gathered.ok:
        assert eng.state.gathered_next
    if hvd.rank() == 1:
        os._exit(3)
    with pytest.raises(hvd.HorovodInternalError) as info:
        for _ in range(3):
            hvd.allreduce(torch.ones(1), name="steady")
    assert "rank 1" in str(info.value) and "timed out" not in str(info.value), info.value


def test_a_peer_lost_in_a_gathered_cycle_is_named() -> None:
    outs = hvd_outcomes(_dies_in_steady_state, 2, env={"UNISON_TIMEOUT": "20"}, timeout=60)
    assert outs[0].ok, outs[0].describe()
    assert not outs[1].ok


def _left_pending() -> list[float]:
    import unison.torch as hvd

    r = hvd.rank()
    for name in ("a", "b", "warm", "warm", "warm"):
        hvd.allreduce(torch.ones(1), name=name, op=hvd.Sum)
    # cycles that leave a tensor pending on a rank with nothing new to submit: the next
    # cycle must not be gathered, or that rank would enter it only after idle_answer_s
    # (200 s here) while its peer waits in it. Rank 0 announces a; rank 1 b then a (one
    # cycle {b} or {a, b}); whichever, one rank is left holding a tensor the other submits
    # later (a on rank 0, or b on rank 1 until rank 0 submits b)
    if r == 0:
        ha = hvd.allreduce_async(torch.ones(1), name="a", op=hvd.Sum)
        time.sleep(0.5)
        hb = hvd.allreduce_async(torch.ones(1), name="b", op=hvd.Sum)
    else:
        time.sleep(0.1)
        hb = hvd.allreduce_async(torch.ones(1), name="b", op=hvd.Sum)
        ha = hvd.allreduce_async(torch.ones(1), name="a", op=hvd.Sum)
    return [hvd.synchronize(ha).item(), hvd.synchronize(hb).item()]


def test_a_cycle_that_leaves_work_pending_is_not_followed_by_a_gathered_one() -> None:
    env = {"UNISON_TIMEOUT": "600", "HOROVOD_STALL_CHECK_DISABLE": "1"}
    assert hvd_spawn(_left_pending, 2, env=env, timeout=100) == [[2.0, 2.0]] * 2
