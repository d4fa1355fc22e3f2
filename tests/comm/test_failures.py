"""Errors: bad input, mismatched calls, dead and silent peers — never a hang."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import unison as un
from unison.testing import run_ranks, spawn

pytestmark = pytest.mark.timeout(60)


def test_calls_before_init_raise() -> None:
    with pytest.raises(un.NotInitializedError, match="init"):
        un.all_reduce(np.zeros(3))
    with pytest.raises(un.NotInitializedError):
        un.rank()


def _invalid() -> None:
    p = un.size()
    cases = [
        (lambda: un.all_reduce(np.zeros((4, 4))[:, 0]), "contiguous"),
        (lambda: un.all_reduce(np.zeros(4), op=un.ReduceOp.BXOR), "integer or bool"),
        (lambda: un.all_reduce(np.zeros(4, np.complex64)), "unsupported dtype"),
        (lambda: un.all_reduce([1, 2, 3]), "numpy array or a torch tensor"),
        (lambda: un.broadcast(np.zeros(4), src=p), "not a rank"),
        (lambda: un.all_gather([np.zeros(4)], np.zeros(4)), "entries"),
        (lambda: un.all_gather([np.zeros(3)] * p, np.zeros(4)), "elements"),
        (lambda: un.all_gather_into_tensor(np.zeros(4), np.zeros(4)), "must hold"),
        (lambda: un.reduce_scatter(np.zeros(2), [np.zeros(2, np.int32)] * p), "int32"),
        (lambda: un.all_to_all_single(np.zeros(5), np.zeros(5)), "divisible"),
        (
            lambda: (
                un.gather(np.zeros(1), None, dst=0)
                if un.rank() == 0
                else un.gather(np.zeros(1), [np.zeros(1)] * p, dst=0)
            ),
            "root",
        ),
        (lambda: un.all_reduce(np.zeros(3), op="sum"), "ReduceOp"),
    ]
    for fn, text in cases:
        with pytest.raises(un.InvalidArgumentError, match=text):
            fn()
    x = np.ones(4)
    un.all_reduce(x)  # nothing was sent by the bad calls: the group still works
    assert (x == p).all()


def test_invalid_arguments_raise_before_anything_is_sent() -> None:
    spawn(_invalid, 2)


def _mismatch(kind: str) -> str:
    r = un.rank()
    try:
        if kind == "op":
            if r == 0:
                un.all_reduce(np.zeros(10, np.float32))
            else:
                un.broadcast(np.zeros(10, np.float32), src=1)
        elif kind == "count":
            un.all_reduce(np.zeros(10 + r, np.float32))
        elif kind == "dtype":
            un.all_reduce(np.zeros(10, np.float32 if r == 0 else np.float64))
        elif kind == "root":
            un.broadcast(np.zeros(10), src=0 if r != 1 else 1)
        elif kind == "redop":
            un.all_reduce(np.zeros(10), op=un.ReduceOp.SUM if r == 0 else un.ReduceOp.MAX)
    except un.MismatchError as exc:
        return str(exc)
    raise AssertionError("no mismatch detected")


@pytest.mark.parametrize("kind", ["op", "count", "dtype", "redop", "root"])
def test_mismatched_calls_raise_on_every_rank(kind: str) -> None:
    start = time.monotonic()
    msgs = spawn(_mismatch, 3, args=(kind,), env={"UNISON_TIMEOUT": "20"})
    assert time.monotonic() - start < 15, "mismatch found only by the timeout"
    for m in msgs:
        assert "mismatch" in m, m
        assert "called" in m or "sizes" in m, m
    if kind == "op":
        assert any("all_reduce" in m and "broadcast" in m for m in msgs), msgs
    if kind == "root":
        assert any("root=0" in m and "root=1" in m for m in msgs), msgs


def _each_its_own_root(kind: str, n: int) -> str:
    """Every rank believes it is the root: all wait to receive, none sends."""
    r, p = un.rank(), un.size()
    x = np.full(n, r + 1.0, np.float32)
    try:
        if kind == "gather":
            un.gather(x, [np.empty(n, np.float32) for _ in range(p)], dst=r)
        else:
            un.reduce(x, dst=r)
    except un.MismatchError as exc:
        return f"{exc.op}: {exc}"
    raise AssertionError("no mismatch detected")


@pytest.mark.parametrize("n", [8, 200_000])
@pytest.mark.parametrize("kind", ["gather", "reduce"])
@pytest.mark.parametrize("p", [2, 3])
def test_root_mismatch_in_gather_and_reduce_fails_fast(p: int, kind: str, n: int) -> None:
    """It hung to the deadline (60 s here), then blamed a live rank for not answering."""
    start = time.monotonic()
    msgs = spawn(_each_its_own_root, p, args=(kind, n), env={"UNISON_TIMEOUT": "60"}, timeout=90)
    assert time.monotonic() - start < 30, "mismatch found only by the timeout"
    for m in msgs:
        assert m.startswith(f"{kind}: ") and "mismatch" in m and "root=" in m, m


def _pairs_disagree_on_root(kind: str, n: int, tries: int) -> list[tuple[str, str]]:
    """Ranks 0 and 1 root the call at 0, ranks 2 and 3 at 2: each pair agrees within
    itself. Repeated on fresh groups (a mismatch leaves its group unusable)."""
    r, p = un.rank(), un.size()
    root = 0 if r < 2 else 2
    out = []
    for _ in range(tries):
        g = un.new_group(list(range(p)))
        x = np.full(n, r + 1.0, np.float32)
        try:
            if kind == "gather":
                bufs = [np.empty(n, np.float32) for _ in range(p)] if r == root else None
                un.gather(x, bufs, dst=root, group=g)
            elif kind == "broadcast":
                un.broadcast(x, root, group=g)
            else:
                un.reduce(x, dst=root, group=g)
        except un.MismatchError as exc:
            out.append((str(exc.op), str(exc)))
            continue
        raise AssertionError("no mismatch detected")
    return out


@pytest.mark.parametrize("n", [8, 200_000])
@pytest.mark.parametrize("kind", ["gather", "reduce", "broadcast"])
def test_root_mismatch_between_agreeing_pairs_fails_fast_naming_the_call(kind: str, n: int) -> None:
    """Every rank's root is compared with every other's, not only a partner's. The
    mismatch names the call: it named the internal signature confirmation ("check")
    on some runs of a small reduce. (A broadcast by messages starts its confirmation
    before the data moves, as gather and reduce do.)"""
    start = time.monotonic()
    outs = spawn(
        _pairs_disagree_on_root, 4, args=(kind, n, 4), env={"UNISON_TIMEOUT": "60"}, timeout=90
    )
    assert time.monotonic() - start < 30, "mismatch found only by the timeout"
    for per_rank in outs:
        for op, text in per_rank:
            assert op == kind, (op, text)
            assert f"mismatched collective at {kind} #" in text, text
            assert "root=0" in text and "root=2" in text and "check" not in text, text


def _told_before_calling() -> str:
    """Rank 0 hears that rank 1 failed reduce #1 of a new group before rank 0 calls it
    (delivered here as rank 0's transport would: the news itself lost on its way to rank
    1, as when its origin's goodbye overtakes it). Rank 0 stays alive afterwards, so rank
    1 cannot learn anything from a goodbye."""
    from unison.world import current

    g = un.new_group([0, 1])
    x = np.ones(4, np.float32)
    if un.rank() == 0:
        info: dict[str, object] = {
            "group": g.id,
            "seq": 1,
            "kind": "mismatch",
            "op": "reduce",
            "message": "mismatched collective at reduce #1 (told)",
            "origin": 1,
        }
        current().fabric.events.abort(1, info)  # type: ignore[attr-defined]
        try:
            un.reduce(x, dst=0, group=g)
        except un.MismatchError as exc:
            time.sleep(4)
            return type(exc).__name__
        return "no error"
    start = time.monotonic()
    try:
        un.reduce(x, dst=0, group=g)
    except un.CommunicationError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - start:.0f} s: {exc}"
    return "no error"


def test_a_call_failed_before_it_started_passes_the_news_on() -> None:
    """A rank that learns of a call's failure before it makes the call fails it at once
    and tells the others, as for a failure met during the call: the peer waiting in the
    call hears the mismatch, not a timeout or (after the rank left) its goodbye."""
    outs = spawn(_told_before_calling, 2, env={"UNISON_TIMEOUT": "15"}, timeout=60)
    assert outs[0] == "MismatchError"
    assert outs[1].startswith("MismatchError after 0 s") and "(told)" in outs[1], outs[1]


def _splits_disagree() -> str:
    """Rank 0's splits say it sends itself nothing but expects 4 elements from itself."""
    r = un.rank()
    out, inp = np.empty(4, np.float32), np.arange(4, dtype=np.float32)
    splits = ([4, 0], [0, 4]) if r == 0 else ([2, 2], [2, 2])
    try:
        un.all_to_all_single(out, inp, *splits)
    except un.MismatchError as exc:
        return f"{exc.op}: {exc}"
    raise AssertionError("no mismatch detected")


def test_all_to_all_single_splits_that_disagree_raise_mismatch_on_every_rank() -> None:
    """Rank 0 got a raw numpy ValueError (its own block copied into a larger one)."""
    msgs = spawn(_splits_disagree, 2, env={"UNISON_TIMEOUT": "30"}, timeout=60)
    for m in msgs:
        assert m.startswith("all_to_all: ") and "rank 0 sends itself 0 bytes" in m, m


def _dies() -> None:
    r = un.rank()
    un.barrier()
    if r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        un.all_reduce(np.ones(1_000_000, np.float32))
    except un.CommunicationError as exc:
        assert time.monotonic() - start < 5, "took too long to notice"
        assert "rank 1" in str(exc), str(exc)
        # the group is now refused, not hung
        with pytest.raises(un.CommunicationError, match="unusable"):
            un.barrier()
        return
    raise AssertionError("the dead rank went unnoticed")


def test_dead_peer_fails_every_survivor_promptly() -> None:
    outs = run_ranks(_dies, 3, env={"UNISON_TIMEOUT": "60"}, timeout=40)
    assert outs[1].exitcode == -signal.SIGKILL or not outs[1].ok
    for o in (outs[0], outs[2]):
        assert o.ok, o.describe()


def _lost_between_calls(late: bool) -> str:
    """After a barrier, rank 2 alone hears that rank 1 was lost (delivered as its
    transport would on a closed connection), while no call is running there. Rank 1
    stays alive, so rank 0 cannot learn of the loss itself, and rank 2 leaves as soon
    as its next call is refused. ``late``: rank 0 makes its call only after the news
    has arrived."""
    from unison.world import current

    r = un.rank()
    un.barrier()
    if r == 1:
        time.sleep(4)
        return "alive"
    if r == 2:
        current().fabric.events.peer_lost(1, "closed", False)  # type: ignore[attr-defined]
        with pytest.raises(un.AbortedError, match="unusable"):
            un.all_reduce(np.ones(16))
        return "refused"
    if late:
        time.sleep(1)
    start = time.monotonic()
    try:
        un.all_reduce(np.ones(16))
    except un.CommunicationError as exc:
        took = time.monotonic() - start
        return f"{type(exc).__name__} {exc.ranks} after {took:.0f} s: {exc}"
    return "no error"


@pytest.mark.parametrize("late", [False, True], ids=["waiting", "late"])
def test_a_loss_heard_between_calls_is_passed_on(late: bool) -> None:
    """The rank that heard of the loss passes it on before it can leave: rank 0, waiting
    in the all-reduce or entering it afterwards, names the call and the lost rank, not
    the goodbye of the rank that told it."""
    outs = spawn(_lost_between_calls, 3, args=(late,), env={"UNISON_TIMEOUT": "30"}, timeout=60)
    assert outs[1:] == ["alive", "refused"], outs
    assert outs[0].startswith("PeerLostError (1,) after 0 s: all_reduce #2"), outs[0]
    assert "rank 1 was lost (closed) (as rank 2 saw it)" in outs[0], outs[0]


def _silent() -> tuple[str, float]:
    r = un.rank()
    un.barrier()
    if r == 2:
        time.sleep(6)
    start = time.monotonic()
    try:
        un.all_reduce(np.ones(16))
    except un.CommunicationError as exc:
        return type(exc).__name__ + ": " + str(exc), time.monotonic() - start
    return "no error", 0.0


def test_silent_peer_times_out_naming_it() -> None:
    outs = spawn(_silent, 3, env={"UNISON_TIMEOUT": "2"}, timeout=40)
    kinds = [o[0] for o in outs]
    assert all(
        k.startswith("CollectiveTimeoutError") and "rank 2 did not answer" in k for k in kinds[:2]
    ), kinds
    for text, took in outs[:2]:
        assert "all_reduce #2" in text, text
        assert took < 10
    assert outs[2][0].startswith(("AbortedError", "CollectiveTimeoutError")), outs[2]


def _group_mismatch() -> str:
    g = un.new_group([0, 1])
    try:
        if un.rank() == 0:
            un.all_reduce(np.ones(4))
        else:
            un.all_reduce(np.ones(4), group=g)
    except un.CollectiveTimeoutError as exc:
        return str(exc)
    raise AssertionError("no error")


def test_collectives_on_different_groups_are_diagnosed_at_the_timeout() -> None:
    msgs = spawn(_group_mismatch, 2, env={"UNISON_TIMEOUT": "2"}, timeout=40)
    assert "group 1" in msgs[0] and "different collectives" in msgs[0], msgs[0]
    assert "group 0" in msgs[1] and "different collectives" in msgs[1], msgs[1]
