"""Python objects between the ranks of a process set, framework-neutral (pickled into
uint8 buffers): what ``unison.tensorflow`` and ``unison.keras`` offer as
``broadcast_object`` / ``allgather_object``, and what elastic state uses."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .basics import ProcessSet, global_process_set, rank
from .ops import allgather_async, blocking, broadcast_async_, to_numpy

__all__ = ["allgather_object", "broadcast_object"]


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s picklable object on every rank."""
    name = name or type(obj).__name__
    if rank() == root_rank:
        data = np.frombuffer(
            bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8
        )
        length = np.array([data.shape[0]], np.int64)
    else:
        length = np.zeros(1, np.int64)
    blocking(broadcast_async_, length, root_rank, name=f"{name}.sz", process_set=process_set)
    if rank() != root_rank:
        data = np.empty(int(length[0]), np.uint8)
    blocking(broadcast_async_, data, root_rank, name=f"{name}.t", process_set=process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(data.tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable object, in rank order, on every rank."""
    name = name or type(obj).__name__
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = blocking(
        allgather_async,
        np.array([data.shape[0]], np.int64),
        name=f"{name}.sz",
        process_set=process_set,
    )
    gathered = to_numpy(blocking(allgather_async, data, name=f"{name}.t", process_set=process_set))
    out, off = [], 0
    for n in to_numpy(sizes).tolist():
        out.append(pickle.loads(gathered[off : off + n].tobytes()))
        off += n
    return out
