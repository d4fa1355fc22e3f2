"""Sub-groups with a slot region get their own shared arena on one host: their large
collectives run the direct shared-memory algorithms (rounds synchronised on the
sub-group's slots), checked against the numpy oracle and, byte for byte, against the
same calls on a group of the same ranks past the slot regions (the message-based
algorithms); every call takes several rounds of a 1 MiB arena. A sub-group's arena is
allocated in /dev/shm only when the group is made, and a group whose members cannot all
allocate theirs takes the message-based algorithms."""

from __future__ import annotations

import time

import numpy as np

import unison as un
from unison import ReduceOp
from unison.backends.native.shm_setup import Allocator
from unison.testing import reduce_oracle, run_ranks, spawn
from unison.world import current

NBYTES = 3 << 19  # per rank: three rounds of a 1 MiB arena (half of it per round)
ARENA = 1 << 20


def _inp(q: int, n: int, dtype: type, salt: int) -> np.ndarray:
    """Rank ``q``'s input: small integers, so every sum is exact in every dtype."""
    return ((np.arange(n) * 7 + q * 3 + salt) % 11 + 1).astype(dtype)


def _worker() -> list[str]:
    r, p = un.rank(), un.size()
    members = [0, p - 1]
    n_slots = current().config.group_slots
    arena_group = un.new_group(members)  # id 1: a slot region, so an arena
    others = [un.new_group(members) for _ in range(n_slots)]
    general = others[-1]  # the same ranks past the slot regions: no arena
    assert arena_group.id < n_slots <= general.id
    rt = current()
    if r in members:  # a sub-group's arena is agreed before its first chosen algorithm
        rt.choose("all_reduce", 2, 1 << 20, arena_group)
    topo, plain = rt.executors[arena_group.id].topo, rt.executors[general.id].topo
    bad: list[str] = []
    if r not in members:
        if topo.arena is not None:
            bad.append("a non-member got the sub-group's arena")
        un.barrier()
        return bad
    if topo.arena is None or plain.arena is not None:
        un.barrier()
        return [f"arena where expected: {topo.arena is not None}, past the slots: {plain.arena}"]
    if topo.link.half != topo.arena.half:  # type: ignore[attr-defined]
        bad.append("the sub-group's cost model does not use its arena's round size")
    me = members.index(r)
    salt = 0
    for dtype in (np.float32, np.int64, np.float64):
        n = NBYTES // np.dtype(dtype).itemsize + 5  # a ragged last round
        for coll in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
            name = rt.choose(coll, 2, n * np.dtype(dtype).itemsize, arena_group).module.__name__
            if "_shm" not in name:
                bad.append(f"{coll} of {dtype.__name__} on the sub-group chose {name}")
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            salt += 1
            ins = [_inp(q, n, dtype, salt) for q in members]
            fast, ref = ins[me].copy(), ins[me].copy()
            un.all_reduce(fast, op=op, group=arena_group)
            un.all_reduce(ref, op=op, group=general)
            if not np.array_equal(fast, reduce_oracle(ins, op)) or fast.tobytes() != ref.tobytes():
                bad.append(f"all_reduce {op.name} {dtype.__name__}")
        salt += 1
        ins = [_inp(q, n, dtype, salt) for q in members]
        for root in members:
            x = ins[me].copy()
            un.broadcast(x, root, group=arena_group)
            if not np.array_equal(x, ins[members.index(root)]):
                bad.append(f"broadcast root {root} {dtype.__name__}")
        got = np.empty(2 * n, dtype)
        un.all_gather_into_tensor(got, ins[me], group=arena_group)
        blocks = [np.empty(n, dtype) for _ in members]
        un.all_gather(blocks, ins[me], group=arena_group)
        if not (
            np.array_equal(got, np.concatenate(ins)) and np.array_equal(got, np.concatenate(blocks))
        ):
            bad.append(f"all_gather {dtype.__name__}")
        out, ref_out = np.empty(n, dtype), np.empty(n, dtype)
        whole = [_inp(q, 2 * n, dtype, salt) for q in members]
        un.reduce_scatter_tensor(out, whole[me], group=arena_group)
        un.reduce_scatter_tensor(ref_out, whole[me], group=general)
        want = reduce_oracle(whole, ReduceOp.SUM)[me * n : (me + 1) * n]
        if not np.array_equal(out, want) or out.tobytes() != ref_out.tobytes():
            bad.append(f"reduce_scatter {dtype.__name__}")
    if topo.arena.rounds_used == 0:
        bad.append("the sub-group's collectives never used its arena")
    un.barrier()
    return bad


def test_sub_group_arena_matches_oracle_and_general_path() -> None:
    # whether the direct algorithms win at this size depends on the machine's measured
    # round-sync cost (3 ranks on 2 cores: crowded); cheap syncs pinned make the choice
    # the same on every machine, and this test is about the arena path, not the choice
    env = {"UNISON_TIMEOUT": "60", "UNISON_SHM_SYNC": "1e-6", "UNISON_SHM_SYNC_CROWDED": "1e-6"}
    env["UNISON_GROUP_ARENA_BYTES"] = str(ARENA)
    for bad in spawn(_worker, 3, timeout=120, env=env):
        assert bad == []


def _allocated() -> int:
    """Bytes of this rank's segment allocated in /dev/shm."""
    import os

    seg = current().fabric.shm_setup.segment  # type: ignore[attr-defined]
    return int(os.fstat(seg.fd).st_blocks) * 512


def _on_use() -> list[object]:
    """Set-up allocates the world's part of the segment only; making a sub-group with an
    arena allocates that group's part on its members (not on the others), once."""
    r = un.rank()
    fabric = current().fabric  # type: ignore[attr-defined]
    # the world's arena is allocated on a thread as init ends: done before counting
    current().fabric.shm_setup.finish_allocations()  # type: ignore[attr-defined]
    start = _allocated()
    world_ok = start <= fabric.shm_setup.world_part + 4096
    g1 = un.new_group([0, 2])
    fabric.shm_setup.finish_allocations()  # the members' parts are allocated on a thread
    after1 = _allocated()
    n = NBYTES // 8 + 3
    ins = [_inp(q, n, np.float64, 1) for q in (0, 2)]
    if r in (0, 2):
        x = ins[(0, 2).index(r)].copy()
        un.all_reduce(x, group=g1)
        if not np.array_equal(x, reduce_oracle(ins, ReduceOp.SUM)):
            return ["wrong all_reduce"]
    after_use = _allocated()
    g2 = un.new_group([0, 1, 2])
    fabric.shm_setup.finish_allocations()
    after2 = _allocated()
    un.barrier()
    grew1, grew2 = after1 - start, after2 - after_use
    current().choose("all_reduce", 3, 1 << 20, g2)  # agrees on g2's arena
    has = [current().executors[g.id].topo.arena is not None for g in (g1, g2)]
    return [world_ok, grew1, after_use - after1, grew2, has]


def test_sub_group_arena_allocated_only_when_a_group_is_made() -> None:
    env = {"UNISON_TIMEOUT": "60", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    outs = spawn(_on_use, 3, timeout=120, env=env)
    for r, (world_ok, grew1, grew_use, grew2, has) in enumerate(outs):
        assert world_ok, r
        member = r != 1
        assert (ARENA <= grew1 < 2 * ARENA) if member else grew1 == 0, (r, grew1)
        assert grew_use == 0, (r, grew_use)  # using it touches nothing new
        assert ARENA <= grew2 < 2 * ARENA, (r, grew2)
        assert has == [member, True], (r, has)


def _no_room_on_rank_0(arena: str) -> Allocator:
    """An allocator with no room on rank 0 for the arena whose description names
    ``arena`` (/dev/shm full), the real one for everything else."""
    import os

    from unison.backends.native.shm_setup import reserve
    from unison.transport.shm_segment import Segment

    me = int(os.environ["UNISON_RANK"])

    def full(seg: Segment, offset: int, length: int, what: str, needs: int) -> None:
        if me == 0 and arena in what:
            raise OSError(28, "No space left on device")
        reserve(seg, offset, length, what, needs)

    return full


def _no_room() -> list[object]:
    """Rank 0 cannot allocate its part of the first sub-group's arena (/dev/shm full):
    no member uses that group's arena, its collectives take the message-based
    algorithms and give the numpy oracle's result; a later group still gets one."""
    import os

    me = int(os.environ["UNISON_RANK"])
    un.init()
    rt = current()
    rt.fabric.shm_setup.set_allocator(_no_room_on_rank_0("group 1"))  # type: ignore[attr-defined]
    # the world's arena is allocated on a thread as init ends: done before counting
    current().fabric.shm_setup.finish_allocations()  # type: ignore[attr-defined]
    before = _allocated()
    g = un.new_group([0, 1])
    rt.fabric.shm_setup.finish_allocations()  # type: ignore[attr-defined]
    grew = _allocated() - before
    n = NBYTES // 4 + 7
    ins = [_inp(q, n, np.float32, 3) for q in range(2)]
    x = ins[un.rank()].copy()
    un.all_reduce(x, group=g)
    ok = np.array_equal(x, reduce_oracle(ins, ReduceOp.SUM))
    name = rt.choose("all_reduce", 2, x.nbytes, g).module.__name__
    g2 = un.new_group([0, 1])
    y = ins[un.rank()].copy()
    un.all_reduce(y, group=g2)
    ok2 = np.array_equal(y, reduce_oracle(ins, ReduceOp.SUM))
    un.all_reduce(np.ones(1 << 19, np.float32))  # past the slots: the world's arena
    got = [rt.fabric.shm is not None, rt.fabric.arena is not None]  # type: ignore[attr-defined]
    got += [rt.executors[g.id].topo.arena is None, "_shm" in name, ok, grew if me == 0 else 0]
    got += [rt.executors[g2.id].topo.arena is not None, ok2]
    un.shutdown()
    return got


def test_no_room_for_a_sub_group_arena_takes_the_message_path() -> None:
    env = {"UNISON_TIMEOUT": "30", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    outs = run_ranks(_no_room, 2, init=False, env=env, timeout=60)
    for o in outs:
        assert o.ok, o.describe()
        assert o.value == [True, True, True, False, True, 0, True, True]


def _late_member() -> list[object]:
    """Rank 1 is slow to make the sub-group (it has not made it when rank 0's first large
    collective on it must agree on the arena): rank 0 gets a timeout that names the
    collective and the late rank, after UNISON_TIMEOUT, not a hang."""
    import time

    if un.rank() == 1:
        time.sleep(6)  # past rank 0's deadline (UNISON_TIMEOUT=2)
        return ["slept"]
    g = un.new_group([0, 1])
    x = np.ones(NBYTES // 4, np.float32)
    t = time.monotonic()
    try:
        un.all_reduce(x, group=g)
    except un.CollectiveTimeoutError as exc:
        return [type(exc).__name__, str(exc), exc.ranks, round(time.monotonic() - t)]
    return ["no error"]


def test_member_that_never_makes_the_group_is_a_timeout_naming_the_collective() -> None:
    env = {"UNISON_TIMEOUT": "2", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    outs = spawn(_late_member, 2, timeout=60, env=env)
    name, text, ranks, waited = outs[0]
    assert name == "CollectiveTimeoutError", outs[0]
    assert text.startswith("all_reduce: rank 1 did not answer the shared-arena set-up"), text
    assert list(ranks) == [1] and waited <= 4, outs[0]
    assert outs[1] == ["slept"]


def _no_arena() -> list[object]:
    """``new_group(shared_arena=False)`` allocates nothing in /dev/shm on its members and
    never gets an arena; its large collectives give the oracle's result."""
    r = un.rank()
    # the world's arena is allocated on a thread as init ends: done before counting
    current().fabric.shm_setup.finish_allocations()  # type: ignore[attr-defined]
    before = _allocated()
    g = un.new_group([0, 1], shared_arena=False)
    grew = _allocated() - before
    n = NBYTES // 8 + 3
    ins = [_inp(q, n, np.float64, 2) for q in (0, 1)]
    ok = True
    if r in (0, 1):
        x = ins[r].copy()
        un.all_reduce(x, group=g)
        ok = bool(np.array_equal(x, reduce_oracle(ins, ReduceOp.SUM)))
        current().choose("all_reduce", 2, x.nbytes, g)  # where an arena would be agreed
    un.barrier()
    return [grew, ok, current().executors[g.id].topo.arena is None]


def test_shared_arena_false_reserves_no_arena() -> None:
    env = {"UNISON_TIMEOUT": "60", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    for r, got in enumerate(spawn(_no_arena, 3, timeout=120, env=env)):
        assert got == [0, True, True], (r, got)


def _off_thread() -> list[object]:
    """new_group returns before this rank's part of the group's arena is allocated: the
    allocation waits for new_group to return (it would never see that if new_group
    waited for it), and the group's large collective still gets the arena and the
    oracle's result."""
    import threading

    from unison.backends.native.shm_setup import reserve
    from unison.transport.shm_segment import Segment

    returned = threading.Event()
    saw: list[bool] = []

    def late(seg: Segment, offset: int, length: int, what: str, needs: int) -> None:
        saw.append(returned.wait(10.0))
        reserve(seg, offset, length, what, needs)

    un.init()
    rt = current()
    rt.fabric.shm_setup.set_allocator(late)  # type: ignore[attr-defined]
    g = un.new_group([0, 1])
    returned.set()
    n = NBYTES // 4 + 5
    ins = [_inp(q, n, np.float32, 4) for q in range(2)]
    x = ins[un.rank()].copy()
    un.all_reduce(x, group=g)
    got = [saw, rt.executors[g.id].topo.arena is not None]
    got.append(bool(np.array_equal(x, reduce_oracle(ins, ReduceOp.SUM))))
    un.shutdown()
    return got


def test_new_group_does_not_wait_for_its_arena_pages() -> None:
    env = {"UNISON_TIMEOUT": "60", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    for r, got in enumerate(spawn(_off_thread, 2, timeout=120, env=env)):
        assert got == [[True], True, True], (r, got)


def _world_no_room() -> list[object]:
    """Rank 0 cannot allocate its slot of the world's arena (/dev/shm full as init
    ends): neither rank uses the world's arena, the world's large collectives take the
    message-based algorithms and give the oracle's result, and a sub-group still gets
    its own arena."""
    import os

    from unison.backends.native import shm_setup

    me = int(os.environ["UNISON_RANK"])
    shm_setup.reserve = _no_room_on_rank_0("world")  # the allocator of init's set-up
    un.init()
    rt = current()
    n = NBYTES // 4 + 7
    ins = [_inp(q, n, np.float32, 5) for q in range(2)]
    x = ins[me].copy()
    un.all_reduce(x)
    got: list[object] = [bool(np.array_equal(x, reduce_oracle(ins, ReduceOp.SUM)))]
    got.append(rt.fabric.arena is None)  # type: ignore[attr-defined]
    got.append("_shm" in rt.choose("all_reduce", 2, x.nbytes).module.__name__)
    g = un.new_group([0, 1])
    y = ins[me].copy()
    un.all_reduce(y, group=g)
    got += [bool(np.array_equal(y, reduce_oracle(ins, ReduceOp.SUM)))]
    got += [rt.executors[g.id].topo.arena is not None]
    un.shutdown()
    return got


def test_no_room_for_the_world_arena_takes_the_message_path() -> None:
    env = {"UNISON_TIMEOUT": "30", "UNISON_GROUP_ARENA_BYTES": str(ARENA)}
    outs = run_ranks(_world_no_room, 2, init=False, env=env, timeout=60)
    for o in outs:
        assert o.ok, o.describe()
        assert o.value == [True, True, False, True, True]


def _first_large_mismatched() -> list[object]:
    """The world's first large collective on one rank meets a small one on the other:
    agreeing on the world's arena waits for nothing the other rank would only send from
    a large collective of its own, so both get the MismatchError at once, not a timeout."""
    import time

    t = time.monotonic()
    try:
        if un.rank() == 0:
            un.all_reduce(np.ones(NBYTES // 4, np.float32))
        else:
            un.broadcast(np.ones(2, np.float32), 0)
    except un.MismatchError as exc:
        return [type(exc).__name__, time.monotonic() - t < 5]
    except Exception as exc:  # the wrong error
        return [f"{type(exc).__name__}: {exc}"]
    return ["no error"]


def test_first_large_world_collective_mismatched_is_a_mismatch_at_once() -> None:
    outs = spawn(_first_large_mismatched, 2, timeout=60, env={"UNISON_TIMEOUT": "20"})
    assert outs == [["MismatchError", True]] * 2, outs


def _destroyed_at_once() -> list[object]:
    """A group made and the runtime shut down at once, while this rank's part of the
    group's arena is still being allocated (each step of it slowed to 0.3 s): shutdown
    ends the allocation after the step in progress instead of waiting for all of it."""
    from unison.backends.native.shm_setup import ALLOCATION_STEP, reserve
    from unison.transport.shm_segment import Segment

    steps: list[int] = []

    def slow(seg: Segment, offset: int, length: int, what: str, needs: int) -> None:
        steps.append(length)
        time.sleep(0.3)
        reserve(seg, offset, length, what, needs)

    un.init()
    current().fabric.shm_setup.set_allocator(slow)  # type: ignore[attr-defined]
    un.new_group([0, 1])
    un.shutdown()
    return [len(steps), ARENA // ALLOCATION_STEP]


def test_shutdown_ends_an_arena_allocation_after_its_current_step() -> None:
    env = {"UNISON_TIMEOUT": "60", "UNISON_GROUP_ARENA_BYTES": str(8 * ARENA)}
    for r, (took, steps) in enumerate(spawn(_destroyed_at_once, 2, timeout=120, env=env)):
        # 0: shutdown came before the first step began; 8 * steps: it waited for all
        assert took < 8 * steps, (r, took, steps)
