"""The sequence-number slot path: every small collective through the public API on the
world (which takes the slots) against the numpy oracle and the same call on a sub-group
of every rank past the slot regions (which takes the general path), across dtypes, ops
and counts; the slots alone for sequence wrap-around, mismatch and deadline; a peer
dying in a slot wait."""

from __future__ import annotations

import mmap
import os
import signal
import time

import numpy as np
import pytest

import unison as un
from unison import ReduceOp
from unison.buffers import check_op, from_numpy
from unison.errors import CollectiveTimeoutError, MismatchError, UnisonError
from unison.testing import reduce_oracle, run_ranks, spawn
from unison.transport.seqslot import SeqSlots, region_bytes
from unison.world import current


def world_slots() -> SeqSlots | None:
    """The slots the native runtime gave the world (None: the general path only)."""
    return current().fabric.seqslots  # type: ignore[attr-defined]


SLOT = 4096
DTYPES = (np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8, np.float16, np.bool_)
OPS = tuple(ReduceOp)


def _slots() -> tuple[SeqSlots, mmap.mmap]:
    """Map one shared file holding every rank's region (rank 0 creates, all map, then unlink)."""
    r, p = un.rank(), un.size()
    nb = region_bytes(SLOT)
    path = f"/dev/shm/unison-test-seqslot-{os.environ['UNISON_JOB_ID']}"
    if r == 0:
        with open(path, "wb") as f:
            f.truncate(p * nb)
    un.barrier()
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), p * nb)
    un.barrier()
    if r == 0:
        os.unlink(path)
    regions = [memoryview(mm)[q * nb : (q + 1) * nb] for q in range(p)]
    return SeqSlots(r, regions, SLOT), mm


def _inp(q: int, n: int, dtype: type, salt: int) -> np.ndarray:
    """Rank ``q``'s input: small values so every op is exact in every dtype."""
    if dtype is np.bool_:
        return ((np.arange(n) + q + salt) % 3 == 0).astype(np.bool_)
    return ((np.arange(n) * 7 + q * 3 + salt) % 5 + 1).astype(dtype)


def _supported(op: ReduceOp, dtype: type) -> bool:
    """The ops unison accepts for ``dtype`` (the same check every path runs)."""
    dt = from_numpy(np.dtype(dtype))
    assert dt is not None
    try:
        check_op(op, dt)
    except UnisonError:
        return False
    return True


def _worker() -> list[str]:
    slots, _mm = _slots()
    r, p = un.rank(), un.size()
    bad: list[str] = []
    if world_slots() is None:
        return ["the world did not get shared slots"]
    n_slots = current().config.group_slots
    groups = [un.new_group(range(p)) for _ in range(n_slots)]
    every = groups[-1]  # same ranks, no slot region: the general path
    assert every.id >= n_slots
    before = world_slots()._k
    salt = 0
    for dtype in DTYPES:
        for op in OPS:
            if not _supported(op, dtype):
                continue
            for n in (1, 2, 5 * p, SLOT // np.dtype(dtype).itemsize):
                salt += 1
                inputs = [_inp(q, n, dtype, salt) for q in range(p)]
                want = reduce_oracle(inputs, op)
                fast = inputs[r].copy()
                un.all_reduce(fast, op=op)
                general = inputs[r].copy()
                un.all_reduce(general, op=op, group=every)
                if not (np.array_equal(fast, want) and fast.tobytes() == general.tobytes()):
                    bad.append(f"all_reduce {op.name} {np.dtype(dtype)} n={n}")
                m = n // p or 1
                rs_in = np.concatenate([_inp(q, m * p, dtype, salt) for q in [r]])
                rs_all = [_inp(q, m * p, dtype, salt) for q in range(p)]
                out = np.empty(m, dtype)
                un.reduce_scatter(out, list(rs_in.reshape(p, m)), op=op)
                ref = np.empty(m, dtype)
                un.reduce_scatter(ref, list(rs_in.reshape(p, m)), op=op, group=every)
                want_rs = reduce_oracle(rs_all, op)[r * m : (r + 1) * m]
                if not (np.array_equal(out, want_rs) and out.tobytes() == ref.tobytes()):
                    bad.append(f"reduce_scatter {op.name} {np.dtype(dtype)} m={m}")
        for n in (1, 3, SLOT // np.dtype(dtype).itemsize // p):
            salt += 1
            inputs = [_inp(q, n, dtype, salt) for q in range(p)]
            got = [np.empty(n, dtype) for _ in range(p)]
            un.all_gather(got, inputs[r])
            if not np.array_equal(np.concatenate(got), np.concatenate(inputs)):
                bad.append(f"all_gather {np.dtype(dtype)} n={n}")
            for root in range(p):
                x = inputs[r].copy()
                un.broadcast(x, root)
                if not np.array_equal(x, inputs[root]):
                    bad.append(f"broadcast root={root} {np.dtype(dtype)} n={n}")
    if world_slots()._k == before:
        bad.append("the world's small collectives did not take the slots")
    for _ in range(50):  # many back-to-back calls: half reuse and sequence wrap-around logic
        slots.barrier()
        x = np.full(3, r + 1, np.int64)
        slots.all_reduce(x)
        if not np.array_equal(x, np.full(3, p * (p + 1) // 2)):
            bad.append("repeated all_reduce")
    # a large direct algorithm's rounds sync on the slots' barrier, on their own policy:
    # their long waits (a peer copying a whole chunk) never teach the small path's budgets
    world = world_slots()
    cap = current().config.small_bytes // 4  # float32 elements filling the world's slot
    full = [_inp(q, cap, np.float32, 2) for q in range(p)]
    x, y = full[r].copy(), full[r].copy()
    un.all_reduce(x)
    un.all_reduce(y, group=every)
    if not (np.array_equal(x, reduce_oracle(full, ReduceOp.SUM)) and x.tobytes() == y.tobytes()):
        bad.append("all_reduce filling the world's slot")
    small_waits = world.policy.waits
    big = [_inp(q, 2 * cap, np.float32, 1) for q in range(p)]  # above the slots
    for _ in range(3):
        x = big[r].copy()
        un.all_reduce(x)
        if not np.array_equal(x, reduce_oracle(big, ReduceOp.SUM)):
            bad.append("large all_reduce over the slot-synced rounds")
    if world.policy.waits != small_waits:
        bad.append("a large algorithm's round waits taught the small collectives' policy")
    # ranks that disagree get a typed error on every rank, then the slots still work
    try:
        slots.all_reduce(np.ones(2 + r, np.float32))
        bad.append("mismatched counts were not detected")
    except MismatchError as exc:
        if exc.op != "all_reduce" or f"rank {r}" not in str(exc):
            bad.append(f"mismatch error unclear: {exc}")
    x = np.ones(4, np.float32)
    slots.all_reduce(x)
    if not np.array_equal(x, np.full(4, p, np.float32)):
        bad.append("all_reduce after a mismatch")
    # a rank that never arrives: the others time out, naming it
    un.barrier()
    if r == 0:
        try:
            slots.barrier(timeout=0.5)
            bad.append("barrier without peers returned")
        except CollectiveTimeoutError as exc:
            if list(exc.ranks) != list(range(1, p)):
                bad.append(f"timeout names {exc.ranks}")
    un.barrier()
    return bad


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_small_collectives_match_oracle_and_general_path(np_: int) -> None:
    for bad in spawn(_worker, np_, timeout=200, env={"UNISON_TIMEOUT": "60"}):
        assert bad == []


def _dies_in_slot_wait() -> str:
    r = un.rank()
    un.barrier()
    if r == 1:
        time.sleep(0.5)  # the others are waiting in the slots by now
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        un.all_reduce(np.ones(4, np.float32))
    except un.CommunicationError as exc:
        took = time.monotonic() - start
        assert took < 10, f"took {took:.1f}s to notice"
        assert "rank 1" in str(exc) and "all_reduce" in str(exc), str(exc)
        with pytest.raises(un.CommunicationError):
            un.barrier()  # refused (or failed), never hung
        return type(exc).__name__
    raise AssertionError("the dead rank went unnoticed")


def test_peer_dying_in_a_slot_wait_fails_the_others_promptly() -> None:
    outs = run_ranks(_dies_in_slot_wait, 3, env={"UNISON_TIMEOUT": "60"}, timeout=60)
    for o in (outs[0], outs[2]):
        assert o.ok, o.describe()
        assert o.value in ("PeerLostError", "AbortedError"), o.value


def _large_mismatch() -> str:
    """Above the slot size the direct shm algorithms run; their rounds sync on the slots,
    which compare the whole signature: disagreeing ranks fail, every one of them."""
    n = 512 << 10  # float32 elements: 2 MiB, above UNISON_SMALL_BYTES (1 MiB)
    try:
        if un.rank() == 0:
            un.all_reduce(np.ones(n, np.float32))
        else:
            un.broadcast(np.ones(n, np.float32), src=1)
    except un.MismatchError as exc:
        return str(exc)
    raise AssertionError("no mismatch detected")


def test_large_mismatch_is_caught_by_the_slot_sync() -> None:
    msgs = spawn(_large_mismatch, 2, env={"UNISON_TIMEOUT": "30"}, timeout=60)
    assert any("all_reduce" in m and "broadcast" in m for m in msgs), msgs


def _oversubscribed() -> list[str]:
    """Ranks outnumbering cores: each wait yields once at most, then sleeps on the peer's
    futex until the peer publishes; results stay right and nothing hangs."""
    from unison.transport import futex

    r, p = un.rank(), un.size()
    base, mm = _slots()
    slots = SeqSlots(
        r, [memoryview(mm)[q * region_bytes(SLOT) :] for q in range(p)], SLOT, oversubscribed=True
    )
    del base
    counts = {"yield": 0, "sleep": 0}
    real_yield, real_wait = os.sched_yield, futex.wait

    def count(name: str, fn):  # type: ignore[no-untyped-def]
        def inner(*a):  # type: ignore[no-untyped-def]
            counts[name] += 1
            return fn(*a)

        return inner

    os.sched_yield = count("yield", real_yield)  # the os module, as the waits see it
    futex.wait = count("sleep", real_wait)
    bad = []
    try:
        for i in range(40):
            if r == 1 and i % 2:
                time.sleep(0.02)  # rank 0 waits for this rank: it must sleep, not spin
            x = np.full(5, r + i, np.int64)
            slots.all_reduce(x, timeout=30)
            if not np.array_equal(x, np.full(5, sum(q + i for q in range(p)))):
                bad.append(f"call {i}: {x}")
    finally:
        os.sched_yield = real_yield  # the os module, as the waits see it
        futex.wait = real_wait
    if slots.policy.spin_s != 0.0:
        bad.append("an oversubscribed wait spins")
    waits = slots.policy.waits  # the waits that had to wait (each one observed)
    if counts["yield"] > waits:
        bad.append(f"{counts['yield']} yields in {waits} waits (at most one each)")
    if r == 0 and counts["sleep"] == 0:
        bad.append("rank 0 never slept on the futex while rank 1 was away")
    un.barrier()
    return bad


def test_oversubscribed_waits_sleep_on_the_futex() -> None:
    for bad in spawn(_oversubscribed, 2, timeout=60):
        assert bad == []
