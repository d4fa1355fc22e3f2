"""Pure schedules, checked by simulating the message flow in one process."""

from __future__ import annotations

import pytest

from unison.algorithms import _schedule as s

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 31]


@pytest.mark.parametrize("p", SIZES)
def test_binomial_tree_reaches_every_rank_once(p: int) -> None:
    for root in range(p):
        parents = {r: s.binomial_parent(r, p, root) for r in range(p)}
        assert parents[root] == -1
        for r in range(p):
            if r != root:
                assert r in s.binomial_children(parents[r], p, root)
        # every rank is somebody's child exactly once, except the root
        kids = [c for r in range(p) for c in s.binomial_children(r, p, root)]
        assert sorted(kids) == sorted(set(range(p)) - {root})
        # depth is at most ceil(log2 p)
        for r in range(p):
            depth, x = 0, r
            while parents[x] != -1:
                x, depth = parents[x], depth + 1
            assert depth <= max(0, (p - 1).bit_length())


@pytest.mark.parametrize("p", SIZES)
def test_recursive_doubling_plan_combines_everyone(p: int) -> None:
    # simulate: each rank holds a set of contributions; exchanges union them
    have = {r: {r} for r in range(p)}
    plans = {r: s.recursive_doubling_plan(r, p) for r in range(p)}
    for r, (role, partner, _) in plans.items():
        if role == "fold":
            assert plans[partner][0] == "core" and plans[partner][1] == r
            have[partner] |= have[r]
    steps = max(len(pl[2]) for pl in plans.values())
    for k in range(steps):
        snapshot = {r: set(v) for r, v in have.items()}
        for r, (role, _, peers) in plans.items():
            if role == "core":
                peer = peers[k]
                assert plans[peer][2][k] == r  # exchanges are symmetric
                have[r] |= snapshot[peer]
    for r, (role, partner, _) in plans.items():
        if role == "fold":
            have[r] = have[partner]
    assert all(v == set(range(p)) for v in have.values())


@pytest.mark.parametrize("p", SIZES)
def test_dissemination_informs_everyone(p: int) -> None:
    know = {r: {r} for r in range(p)}
    rounds = s.dissemination_peers(0, p)
    for k in range(len(rounds)):
        snap = {r: set(v) for r, v in know.items()}
        for r in range(p):
            _, src = s.dissemination_peers(r, p)[k]
            assert s.dissemination_peers(src, p)[k][0] == r
            know[r] |= snap[src]
    assert all(v == set(range(p)) for v in know.values())


@pytest.mark.parametrize("count,parts", [(0, 3), (1, 4), (10, 3), (7, 7), (1000, 6)])
def test_chunks_cover_exactly(count: int, parts: int) -> None:
    ch = s.chunks(count, parts)
    assert len(ch) == parts
    assert sum(n for _, n in ch) == count
    assert all(ch[i][0] + ch[i][1] == ch[i + 1][0] for i in range(parts - 1))
    assert max(n for _, n in ch) - min(n for _, n in ch) <= 1


def test_segments() -> None:
    assert s.segments(0, 4) == [(0, 0)]
    assert s.segments(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert s.segments(3, 100) == [(0, 3)]


def test_ring_neighbors() -> None:
    assert s.ring_neighbors(0, 4) == (3, 1)
    assert s.ring_neighbors(0, 1) == (0, 0)
