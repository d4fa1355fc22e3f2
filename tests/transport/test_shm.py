"""Shared-memory transport: routing, segment lifetime, direct collectives, fallbacks."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import socket
import sys
import threading
import time

import numpy as np
import pytest

import unison as un
from unison import ReduceOp
from unison.errors import UnsupportedError
from unison.testing import reduce_oracle, run_ranks, spawn
from unison.transport.shm_segment import SHM_DIR, Segment, segment_prefix

SHM = {"UNISON_TRANSPORT": "shm", "UNISON_TIMEOUT": "60"}


def _leftovers(job: str) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(segment_prefix(job))]


def _after_init() -> dict[str, object]:
    """Routes, files and link after init; the world's arena once agreed, at the first
    collective that may use it (2 MiB: past the small-message slots), with its slot
    allocated (the segment's whole set-up part) and the sum right."""
    from unison.world import current

    rt = current()
    job = os.environ["UNISON_JOB_ID"]
    setup = rt.fabric.shm_setup  # type: ignore[attr-defined]
    arena_at_init = rt.fabric.arena is not None
    x = np.full(1 << 19, un.rank() + 1.0, np.float32)
    un.all_reduce(x)
    seg = setup.segment
    allocated = os.fstat(seg.fd).st_blocks * 512 if seg is not None else 0
    return {
        "routes": sorted({t.name for t in rt.fabric.route.values()}),
        "files": _leftovers(job),
        "arena": [arena_at_init, rt.fabric.arena is not None],
        "allocated": allocated >= setup.world_part - 4096 > 0,
        "sum": bool((x == sum(range(1, un.size() + 1))).all()),
        "link": type(rt.link).__name__,
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,route,link", [("auto", "shm", "SharedLink"), ("tcp", "tcp", "Link")])
def test_routes_and_segments_unlinked_once_mapped(mode: str, route: str, link: str) -> None:
    job = f"test-{secrets.token_hex(4)}"
    outs = spawn(_after_init, 3, env={"UNISON_TRANSPORT": mode, "UNISON_JOB_ID": job})
    for o in outs:
        assert o["routes"] == [route]
        assert o["files"] == [], "a segment outlived the set-up"
        assert o["arena"] == [False, route == "shm"]
        assert o["allocated"] is (route == "shm")
        assert o["sum"]
        assert o["link"] == link
    assert _leftovers(job) == []


def _create_and_die() -> None:
    Segment.create(os.environ["UNISON_JOB_ID"], un.rank(), 1 << 16)
    os._exit(9)  # killed between creating and unlinking


@pytest.mark.timeout(60)
def test_spawn_removes_segments_of_killed_ranks() -> None:
    job = f"test-{secrets.token_hex(4)}"
    outs = run_ranks(_create_and_die, 2, env={"UNISON_JOB_ID": job}, init=False)
    assert all(not o.ok for o in outs)
    assert _leftovers(job) == []


@pytest.mark.timeout(60)
def test_launcher_removes_segments_of_killed_ranks() -> None:
    from unison.launch.launcher import run_job

    code = (
        "import os, signal;"
        "from unison.transport.shm_segment import Segment;"
        "s = Segment.create(os.environ['UNISON_JOB_ID'], 0, 1 << 16);"
        "print('JOB', os.environ['UNISON_JOB_ID'], os.path.exists(s.path), flush=True);"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    out = io.BytesIO()
    status = run_job([sys.executable, "-c", code], 1, prefix=False, stdout=out, stderr=io.BytesIO())
    assert status != 0
    line = next(ln for ln in out.getvalue().decode().splitlines() if ln.startswith("JOB"))
    _, job, existed = line.split()
    assert existed == "True"
    assert _leftovers(job) == []


def _early_segment(hosts: int) -> dict[str, object]:
    """init where the launcher says every rank is on this host (``UNISON_LOCAL_SIZE``),
    ``hosts`` hosts as the mesh sees them: how many segments this rank created, its
    routes, the files left once init returned, and an all-reduce against the oracle."""
    from unison.transport import shm_segment
    from unison.world import current

    r, size = int(os.environ["UNISON_RANK"]), int(os.environ["UNISON_SIZE"])
    os.environ["UNISON_HOST_ID"] = f"host-{r * hosts // size}"
    made: list[str] = []  # where each segment was made: on a thread of its own or not
    main = threading.main_thread()
    create = shm_segment.Segment.create.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: object, **kwargs: object) -> object:
        seg = create(cls, *args, **kwargs)
        made.append("early" if threading.current_thread() is not main else "in set-up")
        return seg

    shm_segment.Segment.create = classmethod(counted)  # type: ignore[method-assign,assignment]
    un.init()
    # this rank's own files (a rank of the other host may still be setting up its own)
    files = [f for f in _leftovers(os.environ["UNISON_JOB_ID"]) if f"-r{r}-" in f]
    x = np.full(1000, r + 1.0)
    un.all_reduce(x)
    rt = current()
    return {
        "made": made,
        "files": files,
        "routes": sorted({t.name for t in rt.fabric.route.values()}),
        "sum": bool(np.all(x == size * (size + 1) / 2)),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "hosts,made,routes",
    [(1, ["early"], ["shm"]), (2, ["early", "in set-up"], ["shm", "tcp"])],
)
def test_segment_made_while_connecting(hosts: int, made: list[str], routes: list[str]) -> None:
    """The launcher's word that every rank is local starts the segment before the mesh
    connects; init uses it where the mesh agrees (one segment made), and where the
    ranks turn out to span hosts it removes it at once and makes the right one."""
    job = f"test-{secrets.token_hex(4)}"
    env = {"UNISON_LOCAL_SIZE": "4", "UNISON_JOB_ID": job, "UNISON_TIMEOUT": "30"}
    outs = run_ranks(_early_segment, 4, args=(hosts,), env=env, init=False)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs if not o.ok)
    for o in outs:
        assert o.value == {"made": made, "files": [], "routes": routes, "sum": True}
    assert _leftovers(job) == []


def _init_without_store() -> tuple[str, list[str]]:
    """init that fails on the store after the segment was started: the error, and the
    files left (looked at here: the test harness removes a job's files after it)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        un.init(store_addr=f"127.0.0.1:{port}", timeout=1.0)
    except Exception as exc:
        mine = f"-r{os.environ['UNISON_RANK']}-"
        return type(exc).__name__, [f for f in _leftovers(os.environ["UNISON_JOB_ID"]) if mine in f]
    return "", []


@pytest.mark.timeout(60)
def test_segment_made_early_is_removed_when_init_fails() -> None:
    job = f"test-{secrets.token_hex(4)}"
    env = {"UNISON_LOCAL_SIZE": "2", "UNISON_JOB_ID": job}
    outs = run_ranks(_init_without_store, 2, env=env, init=False)
    assert [o.value for o in outs] == [("StoreTimeoutError", [])] * 2


def _grid(algo: str) -> int:
    p, r = un.size(), un.rank()
    cases = 0
    for dtype in (np.float32, np.float64, np.int32, np.float16):
        for n in (0, 1, p - 1, p + 1, 1000, 5000):
            for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
                if op is ReduceOp.AVG and dtype is np.int32:
                    continue
                cases += 1
                rng = np.random.default_rng(cases)
                ins = [(rng.integers(-8, 8, n)).astype(dtype) for _ in range(p)]
                x = ins[r].copy()
                un.all_reduce(x, op=op)
                want = reduce_oracle(ins, op)
                np.testing.assert_allclose(x, want, rtol=1e-2, err_msg=f"{algo} {dtype} {n} {op}")
                big = [(rng.integers(-8, 8, n * p)).astype(dtype) for _ in range(p)]
                out = np.empty(n, dtype)
                un.reduce_scatter_tensor(out, big[r], op=op)
                full = reduce_oracle(big, op)
                np.testing.assert_allclose(out, full[r * n : (r + 1) * n], rtol=1e-2)
            g = np.empty(n * p, dtype)
            un.all_gather_into_tensor(g, ins[r])
            assert np.array_equal(g, np.concatenate(ins))
            for root in range(p):
                b = ins[r].copy() if r == root else np.zeros(n, dtype)
                un.broadcast(b, src=root)
                assert np.array_equal(b, ins[root])
    return cases


_DTYPES = ("float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool")


def _all_reduce_every_dtype(algo: str) -> list[str]:
    """Every dtype and op through the forced all-reduce ``algo``, uneven counts that span
    several slot rounds; the digest of each result (ranks must agree bitwise)."""
    from unison.world import current

    current().overrides = {"all_reduce": algo}
    p, r = un.size(), un.rank()
    digests = []
    for name in _DTYPES:
        dtype = np.dtype(name)
        for n in (0, 1, p + 1, 1531, 2900):  # 2900 float64: six rounds of a 4 KiB slot
            for op in ReduceOp:
                if (op.is_bitwise and dtype.kind == "f") or (op is ReduceOp.AVG and name == "bool"):
                    continue
                rng = np.random.default_rng([n, int(op), len(name)])
                if dtype.kind == "f":
                    ins = [rng.standard_normal(n).astype(dtype) for _ in range(p)]
                elif dtype.kind == "b":
                    ins = [rng.integers(0, 2, n).astype(dtype) for _ in range(p)]
                else:
                    ins = [rng.integers(-3 if dtype.kind == "i" else 0, 4, n).astype(dtype)
                           for _ in range(p)]  # fmt: skip
                x = ins[r].copy()
                un.all_reduce(x, op=op)
                want = reduce_oracle(ins, op)
                what = f"{algo} {name} n={n} {op.name}"
                if dtype.kind == "f":
                    np.testing.assert_allclose(x, want, rtol=5e-3, atol=5e-3, err_msg=what)
                else:
                    assert np.array_equal(x, want), what
                digests.append(f"{what} {hashlib.sha1(x.tobytes()).hexdigest()}")
    return digests


def _grid_small_slot(algo: str) -> int:
    from unison.algorithms import shm_arena

    shm_arena.SLOT_BYTES = 4096  # several rounds for every count above ~500 elements
    un.init()
    cases = _grid(algo)
    if algo == "shm":  # the one-phase all-reduce, in the same job (ranks must agree)
        digests = _all_reduce_every_dtype("shm_one")
        every = un.all_gather_object(digests)
        assert all(d == digests for d in every), "ranks differ bitwise"
        cases += len(digests) + _all_gather_cma()
    return cases


def _grid_model_rounds(algo: str) -> int:
    """Rounds shorter than a half, sized from the link model (as on a host with a fast
    sync): a full-size slot, but every round one page, the pipelined broadcast too."""
    from unison.algorithms import shm_arena

    shm_arena.MIN_ROUND = 4096
    shm_arena.round_fixed = lambda p, link, syncs=1: 1e-12
    un.init()
    cases = _grid(algo)
    for each in ("shm", "shm_one"):
        digests = _all_reduce_every_dtype(each)
        every = un.all_gather_object(digests)
        assert all(d == digests for d in every), f"{each}: ranks differ bitwise"
        cases += len(digests)
    return cases


def _all_gather_cma() -> int:
    """The single-copy all-gather: every dtype, uneven counts, tensor and list outputs;
    it learns on its first call that every rank may read every other."""
    from unison.transport import cma
    from unison.world import current

    rt = current()
    rt.overrides = {"all_gather": "cma"}
    p, r = un.size(), un.rank()
    cases = 0
    for name in _DTYPES:
        for n in (0, 1, p + 1, 3001):
            ins = [(np.arange(n) * (q + 3) % 251).astype(name) for q in range(p)]
            g = np.full(n * p, 7, name)
            un.all_gather_into_tensor(g, ins[r])
            assert np.array_equal(g, np.concatenate(ins)), f"cma {name} n={n}"
            outs = [np.zeros(n, name) for _ in range(p)]
            un.all_gather(outs, ins[r])
            assert all(np.array_equal(o, i) for o, i in zip(outs, ins, strict=True)), name
            cases += 2
    assert rt.fabric.arena is not None and rt.fabric.arena.cma is cma.available()
    return cases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_direct_shm_collectives_against_oracle(p: int) -> None:
    env = {**SHM, "UNISON_ALGO": "all_reduce:shm,reduce_scatter:shm,all_gather:shm,broadcast:shm"}
    outs = run_ranks(_grid_small_slot, p, args=("shm",), env=env, init=False, timeout=110)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs if not o.ok)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [2, 3])
def test_direct_shm_rounds_from_the_model(p: int) -> None:
    env = {**SHM, "UNISON_ALGO": "all_reduce:shm,reduce_scatter:shm,all_gather:shm,broadcast:shm"}
    outs = run_ranks(_grid_model_rounds, p, args=("shm",), env=env, init=False, timeout=110)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs if not o.ok)


def _subgroup_and_big() -> None:
    p, r = un.size(), un.rank()
    g = un.new_group([0, 1])
    if r in (0, 1):
        x = np.full(300_000, r + 1, np.float32)
        un.all_reduce(x, group=g)
        assert np.all(x == 3)
    # 400 KB heap arrays (16 bytes past a page) against page-aligned slots: the copies
    # out of shared memory take copy_into's short-distance detour
    y = np.arange(100_000, dtype=np.float32) * (r + 1) if r == 1 else np.zeros(100_000, np.float32)
    un.broadcast(y, src=1)
    assert np.array_equal(y, np.arange(100_000, dtype=np.float32) * 2)
    outs = [np.zeros(100_000, np.float32) for _ in range(p)]
    un.all_gather(outs, np.full(100_000, r + 0.5, np.float32))
    assert all(np.all(o == q + 0.5) for q, o in enumerate(outs))
    x = np.arange(3_000_000, dtype=np.float32) * (r + 1)  # 12 MB: several slot rounds
    un.all_reduce(x)
    assert np.array_equal(x, np.arange(3_000_000, dtype=np.float32) * (p * (p + 1) // 2))


@pytest.mark.timeout(60)
def test_subgroups_fall_back_and_large_messages() -> None:
    spawn(_subgroup_and_big, 3, env=SHM)


def _mixed_hosts() -> dict[str, object]:
    r = int(os.environ["UNISON_RANK"])
    os.environ["UNISON_HOST_ID"] = f"host-{r // 2}"
    un.init()
    from unison.world import current

    rt = current()
    x = np.full(10_000, r + 1.0)
    un.all_reduce(x)
    assert np.all(x == 10.0)
    return {p: t.name for p, t in rt.fabric.route.items()} | {"link": type(rt.link).__name__}


@pytest.mark.timeout(60)
def test_ranks_on_other_hosts_keep_tcp() -> None:
    outs = run_ranks(_mixed_hosts, 4, env={"UNISON_TIMEOUT": "30"}, init=False)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs if not o.ok)
    r0 = outs[0].value
    assert r0 == {
        1: "shm",
        2: "tcp",
        3: "tcp",
        "link": "TwoLevelLink",
    }  # two hosts: intra and inter links


def _forced_shm_across_hosts() -> None:
    os.environ["UNISON_HOST_ID"] = f"host-{os.environ['UNISON_RANK']}"
    un.init()


@pytest.mark.timeout(60)
def test_forced_shm_refuses_other_hosts() -> None:
    outs = run_ranks(_forced_shm_across_hosts, 2, env=SHM, init=False)
    assert all(not o.ok for o in outs)
    assert any(o.error_type == UnsupportedError.__name__ and "another host" in o.message
               for o in outs)  # fmt: skip


def _background_progress() -> float:
    """Rank 0 sends 8 MB (16 rings' worth) and sleeps without waiting; rank 1 still gets it."""
    n = 8 << 20
    if un.rank() == 0:
        w = un.isend(np.full(n, 7, np.uint8), dst=1)
        time.sleep(3.0)
        assert w.is_completed()
        w.wait()
        return 0.0
    buf = np.zeros(n, np.uint8)
    t0 = time.monotonic()
    un.recv(buf, src=0)
    assert np.all(buf == 7)
    return time.monotonic() - t0


@pytest.mark.timeout(60)
def test_isend_progresses_while_the_sender_does_not_wait() -> None:
    took = spawn(_background_progress, 2, env=SHM)[1]
    assert took < 2.5, f"the receive needed the sender to wait ({took:.1f}s)"


def _choices() -> list[str]:
    from unison.world import current

    rt = current()
    return [rt.choose(c, un.size(), n).name for c in ("all_reduce", "all_gather", "broadcast")
            for n in (8, 1 << 16, 1 << 22, 1 << 28)]  # fmt: skip


@pytest.mark.timeout(60)
def test_every_rank_makes_the_same_choice() -> None:
    outs = spawn(_choices, 4, env=SHM)
    assert all(o == outs[0] for o in outs)
    assert "shm" in outs[0]
