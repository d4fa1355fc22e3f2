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

from collections.abc import Sequence
from typing import Literal, overload

from .._types import BufferLike, ReduceOp
from ..world import current
from . import collectives as _c
from .communicator import Communicator as Group
from .work import Work

__all__ = [
    "Group",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "cross_rank",
    "cross_size",
    "gather",
    "get_world_group",
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


def _g(group: Group | None) -> Group:
    rt = current()
    return rt.world if group is None else group


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


def new_group(ranks: Sequence[int] | None = None) -> Group:
    """Create a group of ``ranks`` (global ranks). Every rank of the world must call it,
    in the same order, as in torch.distributed; non-members get a group they cannot use."""
    return current().new_group(ranks)


def send(buf: BufferLike, dst: int, tag: int = 0, group: Group | None = None) -> None:
    """Send ``buf`` to rank ``dst``; messages with one tag arrive in order."""
    isend(buf, dst, tag, group).wait()


def recv(buf: BufferLike, src: int, tag: int = 0, group: Group | None = None) -> None:
    """Receive a message from rank ``src`` with ``tag`` into ``buf``."""
    irecv(buf, src, tag, group).wait()


def isend(buf: BufferLike, dst: int, tag: int = 0, group: Group | None = None) -> Work:
    """Start sending ``buf`` to ``dst``; do not modify ``buf`` until the Work completes."""
    return _g(group).isend(buf, dst, tag)


def irecv(buf: BufferLike, src: int, tag: int = 0, group: Group | None = None) -> Work:
    """Start receiving from ``src`` into ``buf``."""
    return _g(group).irecv(buf, src, tag)


@overload
def broadcast(
    buf: BufferLike, src: int = 0, group: Group | None = None, async_op: Literal[False] = False
) -> None: ...
@overload
def broadcast(
    buf: BufferLike, src: int = 0, group: Group | None = None, *, async_op: Literal[True]
) -> Work: ...
def broadcast(
    buf: BufferLike, src: int = 0, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Copy ``buf`` from rank ``src`` (a global rank) to every rank of the group, in place."""
    return _c.broadcast(_g(group), buf, src, async_op)


@overload
def all_reduce(
    buf: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_reduce(
    buf: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_reduce(
    buf: BufferLike, op: ReduceOp = ReduceOp.SUM, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Reduce ``buf`` over the group with ``op``; every rank gets the result, in place."""
    return _c.all_reduce(_g(group), buf, op, async_op)


@overload
def reduce(
    buf: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce(
    buf: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce(
    buf: BufferLike,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``buf`` over the group into rank ``dst``'s ``buf``; other buffers stay unchanged."""
    return _c.reduce(_g(group), buf, dst, op, async_op)


@overload
def all_gather(
    out_list: Sequence[BufferLike],
    buf: BufferLike,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_gather(
    out_list: Sequence[BufferLike],
    buf: BufferLike,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_gather(
    out_list: Sequence[BufferLike],
    buf: BufferLike,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``buf`` into ``out_list[i]`` (one per group rank), on every rank."""
    return _c.all_gather(_g(group), out_list, buf, async_op)


@overload
def all_gather_into_tensor(
    out: BufferLike, buf: BufferLike, group: Group | None = None, async_op: Literal[False] = False
) -> None: ...
@overload
def all_gather_into_tensor(
    out: BufferLike, buf: BufferLike, group: Group | None = None, *, async_op: Literal[True]
) -> Work: ...
def all_gather_into_tensor(
    out: BufferLike, buf: BufferLike, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``buf`` into one ``out`` of ``size`` x ``buf`` elements (rank order)."""
    return _c.all_gather_into_tensor(_g(group), out, buf, async_op)


@overload
def gather(
    buf: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def gather(
    buf: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def gather(
    buf: BufferLike,
    gather_list: Sequence[BufferLike] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``buf`` into ``gather_list`` on rank ``dst`` (None elsewhere)."""
    return _c.gather(_g(group), buf, gather_list, dst, async_op)


@overload
def scatter(
    buf: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def scatter(
    buf: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def scatter(
    buf: BufferLike,
    scatter_list: Sequence[BufferLike] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send ``scatter_list[i]`` from rank ``src`` to group rank i's ``buf``."""
    return _c.scatter(_g(group), buf, scatter_list, src, async_op)


@overload
def reduce_scatter(
    out: BufferLike,
    in_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce_scatter(
    out: BufferLike,
    in_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce_scatter(
    out: BufferLike,
    in_list: Sequence[BufferLike],
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``in_list[i]`` over the group into group rank i's ``out``."""
    return _c.reduce_scatter(_g(group), out, in_list, op, async_op)


@overload
def reduce_scatter_tensor(
    out: BufferLike,
    inbuf: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def reduce_scatter_tensor(
    out: BufferLike,
    inbuf: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def reduce_scatter_tensor(
    out: BufferLike,
    inbuf: BufferLike,
    op: ReduceOp = ReduceOp.SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce-scatter from one buffer of ``size`` x ``out`` elements (block i goes to rank i)."""
    return _c.reduce_scatter_tensor(_g(group), out, inbuf, op, async_op)


@overload
def all_to_all(
    out_list: Sequence[BufferLike],
    in_list: Sequence[BufferLike],
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_to_all(
    out_list: Sequence[BufferLike],
    in_list: Sequence[BufferLike],
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_to_all(
    out_list: Sequence[BufferLike],
    in_list: Sequence[BufferLike],
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send ``in_list[j]`` to group rank j; receive its block into ``out_list[j]``."""
    return _c.all_to_all(_g(group), out_list, in_list, async_op)


@overload
def all_to_all_single(
    out: BufferLike,
    inbuf: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: Literal[False] = False,
) -> None: ...
@overload
def all_to_all_single(
    out: BufferLike,
    inbuf: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    *,
    async_op: Literal[True],
) -> Work: ...
def all_to_all_single(
    out: BufferLike,
    inbuf: BufferLike,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """All-to-all of single buffers split along the first dimension (equal or given splits)."""
    return _c.all_to_all_single(
        _g(group), out, inbuf, output_split_sizes, input_split_sizes, async_op
    )


@overload
def barrier(group: Group | None = None, async_op: Literal[False] = False) -> None: ...
@overload
def barrier(group: Group | None = None, *, async_op: Literal[True]) -> Work: ...
def barrier(group: Group | None = None, async_op: bool = False) -> Work | None:
    """Return only when every rank of the group has entered the barrier."""
    return _c.barrier(_g(group), async_op)
