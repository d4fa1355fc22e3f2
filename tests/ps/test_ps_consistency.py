"""Consistency with real processes: BSP equals all-reduce SGD; SSP's bound; ASP never waits."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from typing import Any

import numpy as np
import pytest

import unison as un
import unison.ps as ps
from unison.testing import spawn

from ._harness import run_ps

pytestmark = pytest.mark.timeout(90)

N, D, STEPS, LR, MOM = 96, 20, 12, 0.1, 0.9


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, D))
    y = x @ rng.standard_normal(D) + 0.3
    w0 = rng.standard_normal(D) * 0.1
    return x, y, w0


def _grad(w: np.ndarray, b: np.ndarray, me: int, nw: int) -> tuple[np.ndarray, np.ndarray]:
    x, y, _ = _data()
    xs, ys = x[me::nw], y[me::nw]
    err = xs @ w + b[0] - ys
    return xs.T @ err / N, np.array([err.sum() / N])  # summed over workers: the full gradient


def _ps_worker(kv: ps.KVStore) -> tuple[np.ndarray, np.ndarray]:
    _, _, w0 = _data()
    kv.init_params({"w": w0.copy(), "b": np.zeros(1)})
    kv.set_optimizer(ps.SGD(lr=LR, momentum=MOM))
    rng = random.Random(kv.rank)
    for _ in range(STEPS):
        p = kv.pull(["w", "b"])
        gw, gb = _grad(p["w"], p["b"], kv.rank, kv.num_workers)
        time.sleep(rng.random() * 0.01 * (kv.rank + 1))  # shuffle arrivals
        kv.push({"w": gw, "b": gb})
        kv.clock()
    p = kv.pull(["w", "b"])
    return p["w"], p["b"]


def _allreduce_worker() -> tuple[np.ndarray, np.ndarray]:
    _, _, w0 = _data()
    w, b = w0.copy(), np.zeros(1)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(STEPS):
        gw, gb = _grad(w, b, un.rank(), un.size())
        un.all_reduce(gw)
        un.all_reduce(gb)
        vw = MOM * vw + gw
        vb = MOM * vb + gb
        w, b = w - LR * vw, b - LR * vb
    return w, b


def test_bsp_training_equals_allreduce_sgd() -> None:
    got, servers = run_ps(_ps_worker, 3, 2, ps.BSP(), split_bytes=64)
    want = spawn(_allreduce_worker, 3)
    for w, b in got:
        np.testing.assert_allclose(w, want[0][0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b, want[0][1], rtol=1e-10, atol=1e-12)
    assert all(s.keys > 0 and s.failure is None for s in servers)  # "w" is split over both


def _ssp_worker(
    kv: ps.KVStore, s: int, slow: int, clocks: Any, reads: Any, steps: int
) -> dict[str, int]:
    kv.init_params({"count": np.zeros(1), "w": np.zeros(300)})
    kv.set_optimizer(ps.SGD(lr=1.0))  # pushing -1 adds 1
    me, nw = kv.rank, kv.num_workers
    worst_gap = worst_read = 0
    too_stale = 0
    for c in range(steps):
        p = kv.pull(["count", "w"])
        with clocks.get_lock():
            done = list(clocks)
            reads[me] = c
            worst_read = max(worst_read, max(reads) - min(done))
        worst_gap = max(worst_gap, c - min(done))
        # every push of clocks <= c - s - 1 must be in (nw pushes per clock)
        if p["count"][0] < nw * (c - s):
            too_stale += 1
        if s == 0:
            assert p["count"][0] == nw * c, (c, p["count"][0])
        kv.push({"count": np.full(1, -1.0), "w": np.zeros(300)})
        if me == slow:
            time.sleep(0.05)
        with clocks.get_lock():
            clocks[me] = c + 1  # before the servers hear of it
        kv.clock()
    return {"gap": worst_gap, "read": worst_read, "stale": too_stale}


@pytest.mark.parametrize("s", [0, 2])
def test_ssp_bound_holds_at_every_pull_with_a_straggler(s: int) -> None:
    clocks, reads = mp.Array("i", 4), mp.Array("i", 4)
    got, _ = run_ps(_ssp_worker, 4, 2, ps.SSP(s), args=(s, 3, clocks, reads, 12), split_bytes=512)
    assert all(g["gap"] <= s and g["read"] <= s for g in got), got
    assert all(g["stale"] == 0 for g in got), got
    # the fast workers do run ahead as far as the bound allows (the straggler is 10x slower)
    assert max(g["gap"] for g in got) == s, got


def _asp_worker(kv: ps.KVStore, fast_done: Any, steps: int) -> dict[str, Any]:
    kv.init_params({"w": np.zeros(10)})
    kv.set_optimizer(ps.SGD(lr=0.01))
    if kv.rank == kv.num_workers - 1:  # the straggler: stuck in clock 0 until the others end
        kv.pull("w")
        kv.push({"w": np.ones(10)})
        finished = fast_done.wait(timeout=30)
        kv.clock()
        return {"others_finished_first": finished}
    for _ in range(steps):
        kv.pull("w")
        kv.push({"w": np.ones(10)})
        kv.clock()
    with fast_done.get_lock():
        fast_done.value += 1
    return {"clock": kv.current_clock}


class _Countdown:
    """A cross-process 'all fast workers are done' flag built on a shared counter."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counter = mp.Value("i", 0)

    def get_lock(self) -> Any:
        return self.counter.get_lock()

    @property
    def value(self) -> int:
        return int(self.counter.value)

    @value.setter
    def value(self, v: int) -> None:
        self.counter.value = v

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.counter.value >= self.n:
                return True
            time.sleep(0.01)
        return False


def test_asp_never_blocks_a_fast_worker() -> None:
    done = _Countdown(2)
    got, _ = run_ps(_asp_worker, 3, 1, ps.ASP(), args=(done, 25))
    assert got[0] == {"clock": 25} and got[1] == {"clock": 25}
    assert got[2] == {"others_finished_first": True}
