"""Python objects over the collectives (pickled; for control data, not tensors).

Payloads only ever come from authenticated peers of this job, so unpickling them
is as safe as running the job's own code.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from . import collectives as c
from .group import Group

__all__ = ["all_gather_object", "broadcast_object", "gather_object", "scatter_object"]


def _dump(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()


def _load(arr: np.ndarray) -> Any:
    return pickle.loads(arr.tobytes())


def broadcast_object(comm: Group, obj: Any, src: int) -> Any:
    me = comm.require_member("broadcast_object")
    root = comm.group_rank(src, "src")
    data = _dump(obj) if me == root else np.empty(0, np.uint8)
    n = np.array([data.size], np.int64)
    c.broadcast(comm, n, src, False)
    if me != root:
        data = np.empty(int(n[0]), np.uint8)
    c.broadcast(comm, data, src, False)
    return obj if me == root else _load(data)


def _padded_allgather(comm: Group, data: np.ndarray) -> list[np.ndarray]:
    lengths = np.empty(comm.size, np.int64)
    c.all_gather_into_tensor(comm, lengths, np.array([data.size], np.int64), False)
    width = int(lengths.max())
    mine = np.zeros(width, np.uint8)
    mine[: data.size] = data
    out = np.empty(width * comm.size, np.uint8)
    c.all_gather_into_tensor(comm, out, mine, False)
    return [out[i * width : i * width + int(lengths[i])] for i in range(comm.size)]


def all_gather_object(comm: Group, obj: Any) -> list[Any]:
    comm.require_member("all_gather_object")
    return [_load(x) for x in _padded_allgather(comm, _dump(obj))]


def gather_object(comm: Group, obj: Any, dst: int) -> list[Any] | None:
    me = comm.require_member("gather_object")
    root = comm.group_rank(dst, "dst")
    parts = _padded_allgather(comm, _dump(obj))
    return [_load(x) for x in parts] if me == root else None


def scatter_object(comm: Group, objs: Sequence[Any] | None, src: int) -> Any:
    me = comm.require_member("scatter_object")
    root = comm.group_rank(src, "src")
    lengths = np.empty(comm.size, np.int64)
    blobs: list[np.ndarray] = []
    if me == root:
        if objs is None or len(objs) != comm.size:
            raise InvalidArgumentError(
                f"scatter_object needs a list of {comm.size} objects on the source rank"
            )
        blobs = [_dump(o) for o in objs]
        lengths[:] = [b.size for b in blobs]
    c.broadcast(comm, lengths, src, False)
    width = int(lengths.max())
    mine = np.empty(width, np.uint8)
    padded = None
    if me == root:
        padded = [np.zeros(width, np.uint8) for _ in blobs]
        for p, b in zip(padded, blobs, strict=True):
            p[: b.size] = b
    c.scatter(comm, mine, padded, src, False)
    return _load(mine[: int(lengths[me])])
