"""Rank bodies for the suite items of tests/c10d/test_suite_items.py."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import unison.torch.distributed  # noqa: F401  (registers the backend)

from ._jobs import init

#: the exception text torch's suite expects of a barrier that outlived its group's timeout
TIMEOUT_TEXT = re.compile(" (Timed out|closed|timeout) ")


def _catch(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def _sparse_input(rank: int) -> tuple[torch.Tensor, np.ndarray]:
    """A 5x4 sparse tensor with rank-dependent entries (some shared between ranks)."""
    dense = np.zeros((5, 4), dtype=np.float32)
    dense[rank % 5, rank % 4] = rank + 1.0
    dense[0, 0] = 10.0 * (rank + 1)  # an index every rank has
    if rank == 1:
        dense[4, 3] = -2.5
    return torch.from_numpy(dense.copy()).to_sparse(), dense


def sparse_all_reduce() -> dict[str, Any]:
    rank, size = init()
    t, _ = _sparse_input(rank)
    dist.all_reduce(t)
    want = sum(_sparse_input(r)[1] for r in range(size))
    got = t.to_dense().numpy()
    ok = t.layout is torch.sparse_coo and np.allclose(got, want)
    # none anywhere: an empty sum
    empty = torch.zeros(3, 3).to_sparse()
    dist.all_reduce(empty)
    # a sub-group of ranks 0 and 1
    pair = dist.new_group([0, 1])
    sub_ok = True
    if rank < 2:
        s, _ = _sparse_input(rank)
        dist.all_reduce(s, group=pair)
        sub_ok = np.allclose(s.to_dense().numpy(), _sparse_input(0)[1] + _sparse_input(1)[1])
    err = _catch(lambda: dist.all_reduce(_sparse_input(rank)[0], op=dist.ReduceOp.MAX))
    dist.destroy_process_group()
    return {
        "ok": ok,
        "empty": int(empty.coalesce().values().numel()),
        "sub_ok": sub_ok,
        "max_error": (type(err).__name__, str(err)),
    }


def group_timeout_barrier() -> dict[str, Any]:
    """Rank 0 alone calls barrier on a group made with timeout=1 s; rank 1 stays alive."""
    rank, _ = init(timeout=60.0)
    store = dist.distributed_c10d._get_default_store()
    group = dist.new_group(timeout=timedelta(seconds=1))
    out: dict[str, Any] = {}
    if rank == 0:
        t0 = time.monotonic()
        exc = _catch(lambda: dist.barrier(group))
        out["elapsed"] = time.monotonic() - t0
        out["error"] = (type(exc).__name__, str(exc))
        out["types"] = (isinstance(exc, dist.DistBackendError), isinstance(exc, TimeoutError))
        out["matches"] = exc is not None and TIMEOUT_TEXT.search(str(exc)) is not None
        store.set("suite-test/done", b"1")
        store.wait(["suite-test/bye"], timedelta(seconds=60))  # rank 0 hosts the store
    else:
        # alive until rank 0 has its answer (at most 20 s: the job's timeout is 60 s)
        store.wait(["suite-test/done"], timedelta(seconds=20))
        store.set("suite-test/bye", b"1")
    return out


def monitored_barrier() -> dict[str, Any]:
    """torch's own dist.monitored_barrier on unison's groups, at 3 ranks."""
    rank, size = init(timeout=30.0)
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    two = timedelta(seconds=2)
    dist.monitored_barrier(timeout=two)  # everyone arrives
    dist.monitored_barrier(timeout=two, wait_all_ranks=True)
    # rank 1 stays away: rank 0 names it, rank 2 hears that rank 0 failed
    if rank != 1:
        exc = _catch(lambda: dist.monitored_barrier(timeout=two))
        out["absent"] = (type(exc).__name__, str(exc))
    store.set(f"suite-test/absent{rank}", b"1")
    store.wait([f"suite-test/absent{r}" for r in range(size)], timedelta(seconds=30))
    # rank 0's own time runs out first (timeout 0)
    everyone = dist.new_group(list(range(size)))
    if rank == 0:
        exc = _catch(lambda: everyone.monitored_barrier(timedelta(seconds=0)))
        out["rank0"] = (type(exc).__name__, str(exc))
    # a sub-group: its non-member's call does nothing
    pair = dist.new_group([0, 1])
    if rank == 2:
        out["non_member"] = _catch(lambda: dist.monitored_barrier(pair, timedelta(seconds=1)))
    elif rank == 0:
        exc = _catch(lambda: dist.monitored_barrier(pair, timedelta(seconds=1)))
        out["pair_absent"] = (type(exc).__name__, str(exc))
    # another backend's group still gets torch's own function
    gloo = dist.new_group(list(range(size)), backend="gloo")
    dist.monitored_barrier(gloo, timeout=timedelta(seconds=10))
    out["gloo"] = dist.get_backend(gloo)
    store.set(f"suite-test/end{rank}", b"1")
    store.wait([f"suite-test/end{r}" for r in range(size)], timedelta(seconds=30))
    # rank 0 hosts the store: it leaves after every other rank's last wait was answered
    # (leaving at once reset the connection of a rank whose answer was on its way)
    if rank == 0:
        store.wait([f"suite-test/bye{r}" for r in range(1, size)], timedelta(seconds=30))
    else:
        store.set(f"suite-test/bye{rank}", b"1")
    return out


def late_file_rendezvous(path: str, delay: float) -> list[float]:
    """init_process_group("unison", init_method="file://...") with the last rank late."""
    rank = int(os.environ["UNISON_RANK"])
    size = int(os.environ["UNISON_SIZE"])
    if rank == size - 1:
        time.sleep(delay)
    dist.init_process_group(
        "unison",
        init_method=f"file://{path}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=60),
    )
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def _events(prof: Any) -> list[Any]:
    return list(prof.events() if isinstance(prof, torch.profiler.profile) else prof.function_events)


def profiler_events(kind: str) -> dict[str, Any]:
    """Each operation, run under a profiler, as events named unison:<op> (2 ranks)."""
    rank, size = init()
    peer = 1 - rank
    a = torch.full((3, 2), float(rank))
    b = torch.zeros(2, 5)
    gathered = [torch.zeros(4) for _ in range(size)]
    if kind == "autograd":
        prof: Any = torch.autograd.profiler.profile(record_shapes=True)
    else:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )
    with prof:
        dist.all_reduce(a)  # blocking: completes inline
        dist.all_reduce(b, async_op=True).wait()
        dist.broadcast(a, src=0)
        dist.all_gather(gathered, torch.ones(4))
        dist.barrier()
        if rank == 0:
            dist.send(torch.ones(7), peer)
        else:
            dist.recv(torch.zeros(7), peer)
    seen: dict[str, list[Any]] = {}
    for e in _events(prof):
        if e.name.startswith("unison:"):
            seen.setdefault(e.name, []).append(
                (bool(e.is_async), [list(s) for s in e.input_shapes], int(e.count))
            )
    # not profiling: no events, nothing recorded
    dist.all_reduce(a)
    dist.destroy_process_group()
    return seen


def profiled_p2p_rounds(rounds: int) -> list[int]:
    """``rounds`` profiler sessions of one isend/irecv pair each, the profiler left as
    soon as the requests' wait returns: the number of unison events of each session.
    (The event must be ended before wait returns: the profiler parses its records on
    exit, and an event still being ended then crashed it.)"""
    rank, _ = init()
    peer = 1 - rank
    counts = []
    for i in range(rounds):
        with torch.autograd.profiler.profile() as prof:
            out = torch.zeros(16)
            reqs = [dist.isend(torch.full((16,), float(i)), peer), dist.irecv(out, peer)]
            for r in reqs:
                r.wait()
        counts.append(sum(1 for e in prof.function_events if e.name.startswith("unison:")))
        assert float(out[0]) == float(i), (i, out)
    dist.destroy_process_group()
    return counts
