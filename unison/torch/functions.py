"""Whole-model helpers: broadcast parameters, optimizer state and Python objects."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .basics import ProcessSet, global_process_set
from .ops import allgather_async, blocking, broadcast_async_, synchronize

__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def broadcast_parameters(
    params: Any, root_rank: int, process_set: ProcessSet = global_process_set
) -> None:
    """Overwrite every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()``, a dict of tensors, or a list of
    ``(name, tensor)`` pairs such as ``model.named_parameters()``.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable):
        items = list(params)
        for p in items:
            if not (isinstance(p, tuple) and len(p) == 2):
                raise ValueError("params must be a dict or a list of (name, tensor) pairs")
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}")
    handles = []
    for name, p in items:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        if not isinstance(t, torch.Tensor):
            continue
        handles.append(
            broadcast_async_(t, root_rank, name=f"broadcast.{name}", process_set=process_set)
        )
    for h in handles:
        synchronize(h)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s picklable object on every rank (tensors inside travel too)."""
    from .basics import rank

    name = name or type(obj).__name__
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    blocking(broadcast_async_, length, root_rank, name=f"{name}.sz", process_set=process_set)
    if rank() != root_rank:
        data = torch.empty(int(length.item()), dtype=torch.uint8)
    blocking(broadcast_async_, data, root_rank, name=f"{name}.t", process_set=process_set)
    if rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable object, in rank order, on every rank."""
    name = name or type(obj).__name__
    data = torch.frombuffer(
        bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
    )
    sizes = blocking(
        allgather_async,
        torch.tensor([data.numel()], dtype=torch.int64),
        name=f"{name}.sz",
        process_set=process_set,
    )
    gathered = blocking(allgather_async, data, name=f"{name}.t", process_set=process_set)
    out, off = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[off : off + n].numpy().tobytes()))
        off += n
    return out


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, process_set: ProcessSet = global_process_set
) -> None:
    """Make every rank's optimizer state (and hyper-parameters) equal to ``root_rank``'s.

    Works for every ``torch.optim`` optimizer, LBFGS included: the root's
    ``state_dict()`` travels whole and is loaded everywhere else. As in Horovod, an
    optimizer with no state yet leaves every parameter that requires a gradient with
    one: a parameter without a gradient gets a zero gradient.
    """
    inner = getattr(optimizer, "_unison_inner", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise ValueError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not inner.state:
        for group in inner.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    state = broadcast_object(
        inner.state_dict(), root_rank, name="optimizer.state_dict", process_set=process_set
    )
    from .basics import rank

    if rank() != root_rank:
        inner.load_state_dict(state)
