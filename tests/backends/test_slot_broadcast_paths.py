"""A small broadcast that one rank issues asynchronously (the group's queue runs it) and
the others as blocking calls (each in its own thread, on the slots) before the group's
arena is agreed: both ways compare signatures on the slots and confirm nothing by
message, so neither waits for a confirmation the other never sends. The world (its arena
is agreed at its first large collective) and a sub-group, against the numpy oracle."""

from __future__ import annotations

import numpy as np

import unison as un
from unison.testing import run_ranks


def _mixed() -> list[object]:
    r = un.rank()
    got: list[object] = []
    for group in (None, un.new_group([0, 1, 2])):
        for i in range(3):  # each rank in turn issues it asynchronously
            x = np.arange(6, dtype=np.int64) * (r + 1) + i
            if r == i:
                un.broadcast(x, 0, group=group, async_op=True).wait()
            else:
                un.broadcast(x, 0, group=group)
            got.append(bool(np.array_equal(x, np.arange(6, dtype=np.int64) + i)))
    return got


def test_async_and_blocking_slot_broadcasts_agree_before_the_arena() -> None:
    outs = run_ranks(_mixed, 3, env={"UNISON_TIMEOUT": "10"}, timeout=60)
    for o in outs:
        assert o.ok, o.describe()
        assert o.value == [True] * 6, o.value
