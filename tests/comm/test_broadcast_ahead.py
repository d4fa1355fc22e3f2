"""A broadcast's root that sends by message does not wait for its receivers' signature
confirmation: it runs ahead of them by a bounded number of calls, and a disagreement or
a lost receiver still reaches it, at its next call on the group."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import unison as un
from unison.backends.native.receipts import AHEAD_BYTES, AHEAD_CALLS
from unison.testing import run_ranks, spawn

pytestmark = pytest.mark.timeout(90)

# by message: the confirmation is by message only where the ranks share no memory
TCP = {"UNISON_TRANSPORT": "tcp", "UNISON_TIMEOUT": "30"}


def _wait_for(path: Path, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return path.read_text()
        time.sleep(0.01)
    raise AssertionError(f"{path.name} never appeared")


def _late_receiver_disagrees(tmp: str) -> str:
    """Rank 1 calls its broadcast only after rank 0's has returned, with another count."""
    flag = Path(tmp, "root-returned")
    if un.rank() == 0:
        un.broadcast(np.arange(4, dtype=np.float32), src=0)
        flag.write_text("1")  # the old root waited here for rank 1, which waits for this
        with pytest.raises(un.MismatchError) as info:
            un.all_reduce(np.ones(1, np.float32))
    else:
        _wait_for(flag)
        with pytest.raises(un.MismatchError) as info:
            un.broadcast(np.zeros(8, np.float32), src=0)
    assert info.value.op == "broadcast", info.value
    return str(info.value)


def test_the_root_returns_first_and_hears_of_a_disagreement_at_its_next_call(
    tmp_path: Path,
) -> None:
    msgs = spawn(_late_receiver_disagrees, 2, args=(str(tmp_path),), env=TCP)
    for m in msgs:
        assert "mismatch" in m and "broadcast #1" in m, m


def _root_runs_ahead(tmp: str, n: int, calls: int) -> list[float]:
    """Rank 0 broadcasts ``calls`` times (writing how many returned) while rank 1 holds
    back until rank 0 is stuck; then both finish, with an all_reduce between."""
    done, go = Path(tmp, "done"), Path(tmp, "go")
    r = un.rank()
    x = np.empty(n, np.float32)
    got = []
    if r == 0:
        for i in range(calls):
            x[:] = i
            un.broadcast(x, src=0)
            done.write_text(str(i + 1))
    else:
        end = time.monotonic() + 20
        while not done.exists() or int(done.read_text() or 0) < min(calls, 1):
            assert time.monotonic() < end
            time.sleep(0.01)
        time.sleep(0.5)  # rank 0 would go on, if nothing held it
        got.append(float(done.read_text()))
        go.write_text("1")
        for i in range(calls):
            un.broadcast(x, src=0)
            assert (x == i).all(), (i, x[:4])
    total = np.ones(1, np.float32)
    un.all_reduce(total)
    assert total[0] == 2.0
    un.broadcast(x, src=0)  # the last call is a broadcast: shutdown finishes its confirmation
    return got


@pytest.mark.parametrize("n", [2, 1 << 18])
def test_the_root_runs_ahead_by_a_bounded_number_of_calls_and_bytes(tmp_path: Path, n: int) -> None:
    """8-byte calls stop at AHEAD_CALLS, 1 MiB calls at AHEAD_BYTES."""
    calls = AHEAD_CALLS + 8
    _, (seen,) = spawn(_root_runs_ahead, 2, args=(str(tmp_path), n, calls), env=TCP)
    nbytes = 4 * n
    limit = min(AHEAD_CALLS, AHEAD_BYTES // nbytes)
    assert seen == limit, (seen, limit)


def _receiver_dies_behind_the_root(tmp: str) -> str:
    """Rank 1 is killed once rank 0's broadcast has returned, before it calls its own."""
    flag = Path(tmp, "root-returned")
    if un.rank() == 1:
        _wait_for(flag)
        os.kill(os.getpid(), signal.SIGKILL)
    un.broadcast(np.ones(4, np.float32), src=0)
    flag.write_text("1")
    start = time.monotonic()
    with pytest.raises(un.CommunicationError) as info:
        un.all_reduce(np.ones(4, np.float32))
    assert time.monotonic() - start < 10, "the lost receiver was noticed only by the deadline"
    return str(info.value)


def test_a_receiver_lost_behind_the_root_is_named_at_the_roots_next_call(tmp_path: Path) -> None:
    outs = run_ranks(_receiver_dies_behind_the_root, 2, args=(str(tmp_path),), env=TCP, timeout=60)
    assert outs[0].ok, outs[0]
    assert "rank 1" in outs[0].value and "broadcast #1" in outs[0].value, outs[0].value


def _each_its_own_root() -> str:
    """Two ranks each broadcast as the root: each sends, neither receives."""
    r = un.rank()
    with pytest.raises(un.MismatchError) as info:
        un.broadcast(np.full(4, r, np.float32), src=r)
        un.all_reduce(np.ones(1, np.float32))
    return str(info.value)


def test_two_ranks_that_each_believe_they_are_the_root_both_raise() -> None:
    start = time.monotonic()
    msgs = spawn(_each_its_own_root, 2, env=TCP, timeout=60)
    assert time.monotonic() - start < 20, "found only by the deadline"
    for m in msgs:
        assert "broadcast #1" in m and "root=0" in m and "root=1" in m, m


def _mixed(n: int) -> list[float]:
    """Batches from either root, broken by other calls and the group's end, async too."""
    r = un.rank()
    x = np.empty(n, np.float32)
    sums = []
    for i in range(40):
        root = (i // 7) % 2  # runs of seven calls from one root, then the other
        x[:] = i * 10 + root if r == root else -1
        if i % 11 == 5:
            w = un.broadcast(x, src=root, async_op=True)
            assert w is not None
            w.wait()
        else:
            un.broadcast(x, src=root)
        assert (x == i * 10 + root).all(), (i, x[:2])
        if i % 9 == 8:
            y = np.full(3, r + 1.0, np.float32)
            un.all_reduce(y)
            sums.append(float(y[0]))
    return sums


@pytest.mark.parametrize("n", [1, 300_000])
def test_batches_of_either_root_between_other_calls_give_the_roots_data(n: int) -> None:
    for sums in spawn(_mixed, 2, args=(n,), env=TCP, timeout=60):
        assert sums == [3.0] * 4, sums


class _Call:
    def __init__(self, seq: int, count: int, root: int = 0) -> None:
        from unison._types import OpCode, OpSig

        self.seq = seq
        self.sig = OpSig(int(OpCode.BROADCAST), 9, 0, root, count)


def test_a_batch_receipt_names_its_calls_and_tells_them_apart() -> None:
    """Same calls, same receipt; any other count, sequence or root, another."""
    from unison.backends.native.receipts import Batch

    def receipt(calls: list[_Call]) -> list[int]:
        b = Batch()
        for c in calls:
            assert b.continued_by(c.sig)
            b.add(c)  # type: ignore[arg-type]
        return [int(v) for v in b.receipt()]

    base = receipt([_Call(3, 10), _Call(4, 10)])
    assert base[:2] == [3, 2]
    assert receipt([_Call(3, 10), _Call(4, 10)]) == base
    assert receipt([_Call(3, 10), _Call(4, 11)]) != base
    assert receipt([_Call(3, 10), _Call(5, 10)]) != base
    b = Batch()
    b.add(_Call(1, 10))  # type: ignore[arg-type]
    assert not b.continued_by(_Call(2, 10, root=1).sig)  # another root: a new batch
    for seq in range(2, AHEAD_CALLS + 1):
        b.add(_Call(seq, 10))  # type: ignore[arg-type]
    assert b.full and not b.continued_by(_Call(99, 10).sig)


def _root_leaves_first() -> str:
    """Rank 1, the root, makes a batch's worth of broadcasts and shuts down at once;
    rank 0 makes them later, so its receipt (sent as its last call fills the batch)
    comes after rank 1 has begun to shut down."""
    n = AHEAD_BYTES // 4 // AHEAD_CALLS * 4 + 1  # four calls fill the batch's bytes
    x = np.full(n, 7.0, np.float32)
    if un.rank() == 0:
        time.sleep(1.0)
        x[:] = -1
    for _ in range(AHEAD_CALLS // 4):
        un.broadcast(x, src=1)
    return "ok" if (x == 7.0).all() else "wrong data"


def test_a_root_that_shuts_down_waits_for_its_receivers_receipt() -> None:
    """A root's shutdown ends its open batch as the batch's calls would have: it waits
    for the receiver's receipt, so the receiver's last call does not find it gone."""
    assert spawn(_root_leaves_first, 2, env=TCP, timeout=60) == ["ok", "ok"]
