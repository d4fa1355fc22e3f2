"""Ranks numbered node by node, whatever order Ray placed the actors in (no cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'unison-collectives[ray]')")

from unison.launch.hosts import Slot
from unison.ray.placement import order_by_node


def test_ranks_are_consecutive_per_node_in_first_seen_order() -> None:
    order, slots = order_by_node(["b", "a", "b", "a", "c"])
    assert order == [0, 2, 1, 3, 4]  # actor index of ranks 0..4
    assert slots == [
        Slot(0, "b", 0, 2, 0, 3),
        Slot(1, "b", 1, 2, 0, 3),
        Slot(2, "a", 0, 2, 1, 3),
        Slot(3, "a", 1, 2, 1, 3),
        Slot(4, "c", 0, 1, 2, 3),
    ]
    assert order_by_node(["x"]) == ([0], [Slot(0, "x", 0, 1, 0, 1)])
