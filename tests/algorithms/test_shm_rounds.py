"""Round sizes of the direct shared-memory algorithms (pure: no processes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from unison.algorithms import all_reduce_shm_one, broadcast_shm, shm_arena
from unison.algorithms.shm_arena import (
    Arena,
    in_cache,
    pipeline_bytes,
    round_bytes,
    round_plan,
    rounds,
    warm_round,
)
from unison.link import shared_link

HALF = 4 << 20


def _link(sync: float):  # type: ignore[no-untyped-def]
    return replace(shared_link(half=HALF, slots=True), sync=sync, alpha=1e-6, hop=1e-6)


def test_round_bytes_grow_with_the_sync_and_stop_at_a_half() -> None:
    per_byte = 2e-10
    small, big = round_bytes(2, _link(2e-6), per_byte), round_bytes(2, _link(2e-5), per_byte)
    assert shm_arena.MIN_ROUND <= small < big <= HALF
    assert small % 4096 == 0 and big % 4096 == 0
    assert round_bytes(2, _link(1.0), per_byte) == HALF
    assert round_bytes(2, _link(1e-12), per_byte) == shm_arena.MIN_ROUND
    # the round's fixed cost (the sync here) is then about SYNC_SHARE of its work
    assert shm_arena.SYNC_SHARE * small * per_byte <= 2e-6
    assert 2e-6 <= shm_arena.SYNC_SHARE * (small + 4096) * per_byte


def test_pipeline_bytes_balance_copies_and_rounds() -> None:
    link = replace(_link(1e-5), copy=1e-10)
    n = 16 << 20
    b = pipeline_bytes(2, n, link)
    k = rounds(n, link, b)
    assert 1 < k < n // shm_arena.MIN_ROUND
    # about √(n·c / sync) rounds
    assert abs(k - (n * 1e-10 / 1e-5) ** 0.5) <= 2
    assert rounds(4096, link, pipeline_bytes(2, 4096, link)) == 1  # too small to pipeline


def test_costs_count_the_model_rounds() -> None:
    link = replace(_link(1e-5), copy=1e-10)
    n = 64 << 20
    assert broadcast_shm.cost(2, n, link) > 0
    fast = all_reduce_shm_one.cost(2, n, replace(link, sync=1e-9))
    slow = all_reduce_shm_one.cost(2, n, link)
    assert fast < slow


def test_arena_step_splits_evenly_within_a_half() -> None:
    slots = {0: memoryview(bytearray(8192 + 128)), 1: memoryview(bytearray(8192 + 128))}
    arena = Arena(0, slots, 8192 + 128)
    f4 = np.dtype(np.float32)
    assert arena.half == 4096
    assert arena.step(f4, 1 << 20, 10_000 * 4) == 1000  # capped at a half: 10 rounds
    assert arena.step(f4, 2048, 3000 * 4) == 500  # 6 rounds of 500, not 5 of 512 and one of 440
    assert arena.step(f4, 2048, 0) == 1
    assert arena.step(f4, 2048, 4) == 1


def test_out_of_cache_rounds_fit_the_cache_when_that_pays() -> None:
    hot = _link(1e-5)
    cold = replace(hot, copy=3e-10, gamma=2e-10, warm=8 << 20, warm_copy=1e-10, warm_gamma=1e-10)
    fast = in_cache(2, cold)
    assert in_cache(4, cold) is None  # 4 ranks on 2 cores
    assert fast is not None and fast.copy == pytest.approx(2e-10) and fast.gamma == 1e-10
    assert in_cache(2, hot) is None
    assert warm_round(2, cold) == (8 << 20) // 6 // 4096 * 4096
    assert warm_round(2, hot) == HALF
    r, per_byte = round_plan(2, cold, lambda lk: lk.copy + lk.gamma)
    assert r <= warm_round(2, cold) and per_byte == pytest.approx(3e-10)
    # a sync so dear that the extra rounds cost more than the cache saves: half slots
    r, per_byte = round_plan(2, replace(cold, sync=5e-3), lambda lk: lk.copy + lk.gamma)
    assert r == HALF and per_byte == pytest.approx(5e-10)
