"""Failures seen through torch.distributed: typed as torch's errors, naming rank and op."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import unison
import unison.torch.distributed as udist

from ._jobs import init


def _catch(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("no error raised")


def mismatch_and_timeout() -> dict[str, Any]:
    """3 ranks; init timeout 4 s. A mismatch on a sub-group, then a timeout on the world."""
    rank, _ = init(timeout=4.0)
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    pair = dist.new_group([0, 1])
    if rank in (0, 1):  # rank 2 never reaches the monitored barrier: rank 0 names it
        exc = _catch(lambda: udist.monitored_barrier(timeout=timedelta(seconds=1)))
        out["monitored"] = (type(exc).__name__, str(exc))
        exc = _catch(lambda: dist.all_reduce(torch.ones(4 + rank), group=pair))
        out["mismatch"] = (type(exc).__name__, str(exc))
        out["mismatch_types"] = (
            isinstance(exc, dist.DistBackendError),
            isinstance(exc, RuntimeError),
            isinstance(exc, unison.MismatchError),
        )
    if rank == 2:  # stays alive but never joins the world's all_reduce
        store.wait(["c10d-test/done0", "c10d-test/done1"], timedelta(seconds=60))
        store.set("c10d-test/done2", b"1")  # rank 0 hosts the store: it must outlive this
        return out
    w = dist.all_reduce(torch.ones(3), async_op=True)
    exc = _catch(w.wait)
    out["timeout"] = (type(exc).__name__, str(exc))
    out["timeout_types"] = (
        isinstance(exc, dist.DistBackendError),
        isinstance(exc, TimeoutError),
        isinstance(exc, unison.CollectiveTimeoutError),
    )
    out["exception"] = repr(w.exception())
    store.set(f"c10d-test/done{rank}", b"1")
    store.wait(["c10d-test/done2"], timedelta(seconds=60))
    return out


def dead_rank() -> dict[str, Any]:
    rank, _ = init(timeout=30.0)
    dist.barrier()
    if rank == 1:
        os._exit(3)
    exc = _catch(lambda: dist.all_reduce(torch.ones(100)))
    return {
        "error": (type(exc).__name__, str(exc)),
        "types": (isinstance(exc, dist.DistBackendError), isinstance(exc, unison.PeerLostError)),
    }


def work_wait_timeout() -> dict[str, Any]:
    """Work.wait(timeout) gives up without failing the operation, as torch's does.
    Initialized as "cpu:unison,cuda:nccl": CPU tensors run on unison."""
    rank, _ = init("cpu:unison,cuda:nccl", timeout=30.0)
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    if rank == 0:
        t = torch.empty(2)
        w = dist.irecv(t, src=1, tag=3)
        exc = _catch(lambda: w.wait(timeout=timedelta(seconds=0.2)))
        out["early"] = (type(exc).__name__, isinstance(exc, dist.DistBackendError))
        out["completed_early"] = w.is_completed()
        store.set("c10d-test/go", b"1")
        w.wait()
        out["value"] = t.tolist()
    else:
        store.wait(["c10d-test/go"], timedelta(seconds=60))
        dist.send(torch.tensor([5.0, 6.0]), dst=0, tag=3)
    out["backend"] = str(dist.get_backend())
    t = torch.ones(3)
    dist.all_reduce(t)
    out["sum"] = t.tolist()
    dist.barrier()
    dist.destroy_process_group()
    return out


def bfloat16_against_float32() -> dict[str, Any]:
    """3 ranks. bfloat16 is staged as float32: rank 0 passing bfloat16 where the others pass
    float32 is still a mismatch, for each kind of call (each on a fresh group, as a
    mismatch leaves its group unusable); all ranks passing bfloat16 still agree."""
    rank, size = init(timeout=30.0)
    out: dict[str, Any] = {}

    def t(n: int) -> torch.Tensor:
        return torch.full((n,), float(rank + 1), dtype=torch.bfloat16 if rank == 0 else None)

    cases: dict[str, Any] = {
        "all_reduce_small": lambda g: dist.all_reduce(t(8), group=g),
        "all_reduce_large": lambda g: dist.all_reduce(t(300_000), group=g),
        "all_reduce_async": lambda g: dist.all_reduce(t(8), group=g, async_op=True).wait(),
        "broadcast": lambda g: dist.broadcast(t(8), src=1, group=g),
        "all_gather": lambda g: dist.all_gather([t(8) for _ in range(size)], t(8), group=g),
        "reduce": lambda g: dist.reduce(t(8), dst=2, group=g),
    }
    for name, call in cases.items():
        group = dist.new_group(list(range(size)))
        exc = _catch(lambda: call(group))  # noqa: B023 (called at once)
        out[name] = (
            type(exc).__name__,
            str(exc),
            isinstance(exc, dist.DistBackendError) and isinstance(exc, unison.MismatchError),
            getattr(exc, "op", None),
        )
    same = torch.full((1000,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(same)  # the world group is intact; all bfloat16: no mismatch
    out["sum"] = same.float().tolist()[:3]
    dist.destroy_process_group()
    return out


def subgroup_deadline() -> dict[str, Any]:
    """3 ranks, the default group's timeout 60 s. Sub-groups of all three made with
    timeout=2 s; rank 2 stays alive but never calls their all_reduce (a small and a large
    one, each on its own group: a timeout leaves its group unusable)."""
    rank, size = init(timeout=60.0)
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    groups = [dist.new_group(list(range(size)), timeout=timedelta(seconds=2)) for _ in range(2)]
    if rank != 2:
        for n, g in zip((8, 300_000), groups, strict=True):
            t0 = time.monotonic()
            exc = _catch(lambda: dist.all_reduce(torch.ones(n), group=g))  # noqa: B023
            out[n] = (
                type(exc).__name__,
                str(exc),
                time.monotonic() - t0,
                isinstance(exc, dist.DistBackendError) and isinstance(exc, TimeoutError),
                getattr(exc, "op", None),
                list(getattr(exc, "ranks", None) or ()),
            )
        store.set(f"c10d-test/deadline{rank}", b"1")
    else:
        store.wait(["c10d-test/deadline0", "c10d-test/deadline1"], timedelta(seconds=60))
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)  # the default group is untouched
    out["sum"] = x.tolist()
    dist.destroy_process_group()
    return out
