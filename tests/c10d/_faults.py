"""Rank bodies of the DDP fault tests: the last rank fails at step 5 of training."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from ._jobs import init


def ddp_until_failure(kind: str, timeout: float) -> tuple[Any, ...]:
    """Train a DDP model; at step 5 the last rank exits, is killed, stops (SIGSTOP) or
    stops training (stays alive, calls nothing). The others return (step, error type,
    message) of the error their training step raised, or ("done",)."""
    rank, size = init(timeout=timeout)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        if step == 5 and rank == size - 1:
            if kind in ("stop", "idle"):  # the survivors end it once they failed
                dist.distributed_c10d._get_default_store().set("faults/pid", str(os.getpid()))
            if kind == "exit":
                os._exit(3)
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if kind == "idle":
                time.sleep(3600)
        try:
            opt.zero_grad()
            model(torch.ones(4, 64)).sum().backward()
            opt.step()
        except BaseException as exc:
            if kind in ("stop", "idle"):  # else the harness waits for it to its timeout
                # The store lives in rank 0: once it has failed, killed the stopped
                # rank and returned, the store is gone and the kill already done.
                with contextlib.suppress(dist.DistError):
                    pid = int(dist.distributed_c10d._get_default_store().get("faults/pid"))
                    with contextlib.suppress(ProcessLookupError):  # another survivor did
                        os.kill(pid, signal.SIGKILL)
            return (step, type(exc).__name__, str(exc))
    return ("done",)


def late_to_monitored_barrier() -> tuple[str, str] | None:
    """Rank 0 gives up on rank 1 at a 1 s monitored barrier and leaves the job; rank 1
    arrives 3 s late and returns (error type, message) of its own monitored barrier."""
    from datetime import timedelta

    import torch.distributed as dist

    import unison.torch.distributed as udist

    rank, _ = init(timeout=30.0)
    dist.barrier()
    if rank == 1:
        time.sleep(3.0)
    try:
        udist.monitored_barrier(timeout=timedelta(seconds=1))
    except Exception as exc:
        if rank == 0:
            os._exit(0)  # leaves without a goodbye, as a failing rank 0 does
        return (type(exc).__name__, str(exc))
    return None
