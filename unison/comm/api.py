"""The module-level API: torch.distributed's names and semantics.

Every collective works in place on the caller's buffers (numpy arrays or torch
tensors: CPU tensors on every backend; CUDA tensors for broadcast, all_reduce and
reduce on the ``torch`` backend, which hands them to NCCL), takes ``group=None``
(the world) and ``async_op=False``; with ``async_op=True`` it returns a
:class:`Work` instead of blocking. ``src``/``dst`` are global ranks, also for
sub-groups. Arguments are checked once (:mod:`.collectives`); the group's backend
then runs the call.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from .._types import BufferLike, ReduceOp
from ..errors import InvalidArgumentError
from ..world import current
from . import collectives as _c
from . import objects as _objects
from .group import Group, group_timeout
from .work import Work

__all__ = [
    "Group",
    "P2POp",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "cross_rank",
    "cross_size",
    "gather",
    "get_rank",
    "get_world_group",
    "get_world_size",
    "irecv",
    "isend",
    "local_rank",
    "local_size",
    "new_group",
    "rank",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "size",
]


# The blocking small collectives' entry points spell ``_g`` out for the world (one
# Python call fewer on their path, which the lane keeps at a dozen or so).
def _g(group: Group | None) -> Group:
    rt = current()
    return rt.world if group is None else group


def get_rank(group: Group | None = None) -> int:
    """torch.distributed's name: this process's rank in ``group`` (the world by default)."""
    g = _g(group)
    r = g.rank
    if r is None:
        return -1  # torch.distributed returns -1 for non-members
    return int(r)


def get_world_size(group: Group | None = None) -> int:
    """torch.distributed's name: the number of ranks in ``group`` (the world by default)."""
    return _g(group).size


def rank() -> int:
    """This process's global rank."""
    return current().rank


def size() -> int:
    """Number of processes in the job."""
    return current().size


def local_rank() -> int:
    """Rank among the processes on this host."""
    return current().local_rank


def local_size() -> int:
    """Number of processes on this host."""
    return current().local_size


def cross_rank() -> int:
    """Index of this host among the job's hosts (Horovod's meaning)."""
    return current().cross_rank


def cross_size() -> int:
    """Number of hosts in the job."""
    return current().cross_size


def get_world_group() -> Group:
    return current().world


def new_group(
    ranks: Sequence[int] | None = None,
    *,
    timeout: float | datetime.timedelta | None = None,
    shared_arena: bool = True,
) -> Group:
    """Create a group of ``ranks`` (global ranks). Every rank of the world must call it,
    in the same order and with the same arguments, as in torch.distributed; non-members
    get a group they cannot use.

    ``timeout`` (seconds or a ``timedelta``; None: the job's ``UNISON_TIMEOUT``) bounds
    each operation on the group, as torch.distributed's ``new_group(timeout=...)`` does.
    ``shared_arena``: on one host the members of one of the first sub-groups
    (``UNISON_GROUP_SLOTS``) reserve a shared-memory arena for its large collectives when
    they make it; ``False`` reserves none (for a group that only runs small collectives
    and point-to-point messages). The mpi and torch backends have no arena and ignore it."""
    return current().new_group(ranks, timeout=group_timeout(timeout), arena=bool(shared_arena))


def send(tensor: BufferLike, dst: int, tag: int = 0, group: Group | None = None) -> None:
    """Send ``tensor`` to rank ``dst``; messages with one tag arrive in order."""
    isend(tensor, dst, tag, group).wait()


def recv(
    tensor: BufferLike, src: int | None = None, tag: int = 0, group: Group | None = None
) -> int:
    """Receive a message from rank ``src`` with ``tag`` into ``tensor``; returns the sender.

    ``src=None`` receives from any rank of the group (torch.distributed's meaning):
    the first message to arrive; messages of one sender arrive in the order sent."""
    w = irecv(tensor, src, tag, group)
    w.wait()
    if w.source is not None:
        return w.source
    return src if src is not None else -1


def isend(tensor: BufferLike, dst: int, tag: int = 0, group: Group | None = None) -> Work:
    """Start sending ``tensor`` to ``dst``; do not modify ``tensor`` until the Work completes."""
    return _g(group).isend(tensor, dst, tag)


def irecv(
    tensor: BufferLike, src: int | None = None, tag: int = 0, group: Group | None = None
) -> Work:
    """Start receiving from ``src`` (None: any rank of the group) into ``tensor``."""
    return _g(group).irecv(tensor, src, tag)


@overload
def broadcast(
    tensor: BufferLike, src: int = 0, group: Group | None = None, async_op: Literal[False] = False
) -> None: ...
@overload
def broadcast(
    tensor: BufferLike, src: int = 0, group: Group | None = None, *, async_op: Literal[True]
) -> Work: ...
def broadcast(
    tensor: BufferLike, src: int = 0, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Copy ``tensor`` from rank ``src`` (a global rank) to every rank of the group, in place."""
    return _c.broadcast(current().world if group is None else _g(group), tensor, src, async_op)


@overload
def all_reduce(
    tensor: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_reduce(
    tensor: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_reduce(
    tensor: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` over the group with ``op``; every rank gets the result, in place."""
    return _c.all_reduce(current().world if group is None else _g(group), tensor, op, async_op)


@overload
def reduce(
    tensor: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce(
    tensor: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce(
    tensor: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` over the group into rank ``dst``'s ``tensor``; others stay unchanged."""
    return _c.reduce(_g(group), tensor, dst, op, async_op)


@overload
def all_gather(
    tensor_list: Sequence[BufferLike],
    tensor: BufferLike,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_gather(
    tensor_list: Sequence[BufferLike],
    tensor: BufferLike,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_gather(
    tensor_list: Sequence[BufferLike],
    tensor: BufferLike,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list[i]`` (one per group rank), everywhere."""
    return _c.all_gather(_g(group), tensor_list, tensor, async_op)


@overload
def all_gather_into_tensor(
    output_tensor: BufferLike,
    input_tensor: BufferLike,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_gather_into_tensor(
    output_tensor: BufferLike,
    input_tensor: BufferLike,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_gather_into_tensor(
    output_tensor: BufferLike,
    input_tensor: BufferLike,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``input_tensor`` into one ``output_tensor`` of ``size`` x
    ``input_tensor`` elements (rank order)."""
    return _c.all_gather_into_tensor(
        current().world if group is None else _g(group), output_tensor, input_tensor, async_op
    )


@overload
def gather(
    tensor: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def gather(
    tensor: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def gather(
    tensor: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (None elsewhere)."""
    return _c.gather(_g(group), tensor, gather_list, dst, async_op)


@overload
def scatter(
    tensor: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def scatter(
    tensor: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def scatter(
    tensor: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send ``scatter_list[i]`` from rank ``src`` to group rank i's ``tensor``."""
    return _c.scatter(_g(group), tensor, scatter_list, src, async_op)


@overload
def reduce_scatter(
    output: BufferLike,
    input_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce_scatter(
    output: BufferLike,
    input_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce_scatter(
    output: BufferLike,
    input_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input_list[i]`` over the group into group rank i's ``output``."""
    return _c.reduce_scatter(_g(group), output, input_list, op, async_op)


@overload
def reduce_scatter_tensor(
    output: BufferLike,
    input: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce_scatter_tensor(
    output: BufferLike,
    input: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce_scatter_tensor(
    output: BufferLike,
    input: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce-scatter from one buffer of ``size`` x ``output`` elements (block i goes to rank i)."""
    return _c.reduce_scatter_tensor(
        current().world if group is None else _g(group), output, input, op, async_op
    )


@overload
def all_to_all(
    output_tensor_list: Sequence[BufferLike],
    input_tensor_list: Sequence[BufferLike],
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_to_all(
    output_tensor_list: Sequence[BufferLike],
    input_tensor_list: Sequence[BufferLike],
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_to_all(
    output_tensor_list: Sequence[BufferLike],
    input_tensor_list: Sequence[BufferLike],
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send ``input_tensor_list[j]`` to group rank j; receive into ``output_tensor_list[j]``."""
    return _c.all_to_all(_g(group), output_tensor_list, input_tensor_list, async_op)


@overload
def all_to_all_single(
    output: BufferLike,
    input: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_to_all_single(
    output: BufferLike,
    input: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_to_all_single(
    output: BufferLike,
    input: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """All-to-all of single buffers split along the first dimension (equal or given splits)."""
    return _c.all_to_all_single(
        _g(group), output, input, output_split_sizes, input_split_sizes, async_op
    )


@overload
def barrier(group: Group | None = None, async_op: Literal[False] = False) -> None: ...
@overload
def barrier(group: Group | None = None, *, async_op: Literal[True]) -> Work: ...
def barrier(group: Group | None = None, async_op: bool = False) -> Work | None:
    """Return only when every rank of the group has entered the barrier."""
    return _c.barrier(current().world if group is None else _g(group), async_op)


class P2POp:
    """One send or receive of :func:`batch_isend_irecv` (torch.distributed's class):
    ``op`` is :func:`isend` or :func:`irecv`, ``peer`` a global rank."""

    def __init__(
        self,
        op: Callable[..., Work],
        tensor: BufferLike,
        peer: int | None = None,
        group: Group | None = None,
        tag: int = 0,
    ) -> None:
        if op not in (isend, irecv):
            raise InvalidArgumentError(
                "Invalid ``op``. Expected ``op`` to be of type ``unison.isend`` or "
                "``unison.irecv``."
            )
        if peer is None:
            raise InvalidArgumentError("P2POp: peer must be given")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every send and receive of the list; returns their Works, in list order."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError(
            "Invalid ``p2p_op_list``. Each op is expected to to be of type ``unison.P2POp``."
        )
    return [p.op(p.tensor, p.peer, p.tag, p.group) for p in p2p_op_list]


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Group | None = None) -> None:
    """Replace ``object_list``'s items, on every rank, with those of rank ``src`` (in place)."""
    g = _g(group)
    objs = _objects.broadcast_object(g, list(object_list) if g.global_rank == src else None, src)
    if len(objs) != len(object_list):
        raise InvalidArgumentError(
            f"broadcast_object_list: rank {src} sent {len(objs)} objects, this rank's list "
            f"has {len(object_list)}"
        )
    object_list[:] = objs
