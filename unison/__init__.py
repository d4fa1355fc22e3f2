"""unison: collective communication and data-parallel training for Python.

    import numpy as np, unison as un
    un.init()
    x = np.full(1000, un.rank(), np.float32)
    un.all_reduce(x)

Nothing is probed or started at import time; :func:`init` does the work.
"""

from __future__ import annotations

from typing import Any

from . import errors
from ._types import BufferLike, ReduceOp
from ._version import __version__
from .comm import objects as _objects
from .comm.api import (
    Group,
    P2POp,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    cross_rank,
    cross_size,
    gather,
    get_rank,
    get_world_group,
    get_world_size,
    irecv,
    isend,
    local_rank,
    local_size,
    new_group,
    rank,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
    size,
)
from .comm.work import Work
from .errors import (
    AbortedError,
    CollectiveTimeoutError,
    CommunicationError,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    PeerLostError,
    UnisonError,
)
from .launch.function import run
from .world import current as _current
from .world import init, is_initialized, shutdown

__all__ = [
    "AbortedError",
    "BufferLike",
    "CollectiveTimeoutError",
    "CommunicationError",
    "Group",
    "InvalidArgumentError",
    "MismatchError",
    "NotInitializedError",
    "P2POp",
    "PeerLostError",
    "ReduceOp",
    "UnisonError",
    "Work",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "cross_rank",
    "cross_size",
    "errors",
    "gather",
    "gather_object",
    "get_rank",
    "get_world_group",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "isend",
    "local_rank",
    "local_size",
    "new_group",
    "rank",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "run",
    "scatter",
    "scatter_object",
    "send",
    "shutdown",
    "size",
]


def _group(group: Group | None) -> Group:
    return _current().world if group is None else group


def broadcast_object(obj: Any, src: int = 0, group: Group | None = None) -> Any:
    """Send a picklable object from ``src`` to every rank; returns it everywhere."""
    return _objects.broadcast_object(_group(group), obj, src)


def all_gather_object(obj: Any, group: Group | None = None) -> list[Any]:
    """Every rank's object, in rank order, on every rank."""
    return _objects.all_gather_object(_group(group), obj)


def gather_object(obj: Any, dst: int = 0, group: Group | None = None) -> list[Any] | None:
    """Every rank's object on ``dst`` (a list in rank order); None elsewhere."""
    return _objects.gather_object(_group(group), obj, dst)


def scatter_object(objs: list[Any] | None, src: int = 0, group: Group | None = None) -> Any:
    """Object ``objs[i]`` from ``src`` to group rank i; returns this rank's object."""
    return _objects.scatter_object(_group(group), objs, src)
