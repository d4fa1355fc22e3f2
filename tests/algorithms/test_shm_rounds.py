"""Round sizes of the direct shared-memory algorithms (pure: no processes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from unison.algorithms import all_reduce_shm_one, broadcast_shm, shm_arena
from unison.algorithms.shm_arena import Arena, pipeline_bytes, round_bytes, rounds
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
    assert pipeline_bytes(2, 4096, link) == HALF  # too small to pipeline: one round


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
