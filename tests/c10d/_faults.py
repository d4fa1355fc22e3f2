"""Rank bodies of the DDP fault tests: the last rank fails at step 5 of training."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

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
            return (step, type(exc).__name__, str(exc))
    return ("done",)
