"""``unison.new_group``'s keywords: a group's own ``timeout`` and ``shared_arena``, and
``Group.caller_thread_collectives``."""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

import unison as un
from unison.testing import reduce_oracle, spawn

pytestmark = pytest.mark.timeout(90)


def _bad_timeouts() -> None:
    for bad in (0, -1.0, float("inf"), "5", True):
        with pytest.raises(un.InvalidArgumentError, match="new_group: timeout"):
            un.new_group(timeout=bad)  # type: ignore[arg-type]
    g = un.new_group(timeout=datetime.timedelta(milliseconds=2500))
    assert g.config.timeout == 2.5
    x = np.full(4, un.rank() + 1.0)
    un.all_reduce(x, group=g)
    assert (x == 3.0).all()


def test_new_group_checks_its_timeout() -> None:
    spawn(_bad_timeouts, 2)


def _group_deadline(nbytes: int) -> tuple[str, float]:
    """Rank 2 is late on a group made with ``timeout=2`` while the job's is 60 s: the
    others' call fails after the group's 2 s, naming it and the late rank."""
    g = un.new_group(timeout=2)
    x = np.ones(nbytes // 8)
    if un.rank() == 2:
        time.sleep(5)
    start = time.monotonic()
    try:
        un.all_reduce(x, group=g)
    except un.CommunicationError as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    return "no error", 0.0


@pytest.mark.parametrize("nbytes", [8, 1 << 20], ids=["small", "large"])
def test_a_groups_timeout_bounds_its_operations(nbytes: int) -> None:
    outs = spawn(_group_deadline, 3, args=(nbytes,), env={"UNISON_TIMEOUT": "60"}, timeout=60)
    for text, took in outs[:2]:
        assert text.startswith("CollectiveTimeoutError"), text
        assert "after 2s" in text and "rank 2" in text, text
        assert took < 30, took  # the group's deadline, not the job's 60 s
    assert outs[2][0] != "no error", outs[2]


def _options() -> list[object]:
    r, p = un.rank(), un.size()
    plain = un.new_group()
    quiet = un.new_group(shared_arena=False)
    ins = [((np.arange(300_000) + 3 * q) % 17).astype(np.float32) for q in range(p)]
    x = ins[r].copy()
    un.all_reduce(x, group=quiet)  # large: no arena, the message-based algorithms
    y = np.full(2, r, np.int64)
    un.all_reduce(y, group=quiet)
    ok = np.array_equal(x, reduce_oracle(ins, un.ReduceOp.SUM)) and (y == sum(range(p))).all()
    flags = [g.caller_thread_collectives for g in (un.get_world_group(), plain, quiet)]
    return [ok, flags]


def test_shared_arena_false_computes_and_keeps_the_caller_thread_path() -> None:
    for ok, flags in spawn(_options, 2, env={"UNISON_TIMEOUT": "60"}):
        assert ok
        assert flags == [True, True, True]  # one host: the slots serve small calls


def test_caller_thread_collectives_is_false_without_the_slot_path() -> None:
    env = {"UNISON_TIMEOUT": "60", "UNISON_ALGO": "allreduce:ring"}  # forced: no slots
    for ok, flags in spawn(_options, 2, env=env):
        assert ok
        assert flags == [False, False, False]
