"""The blocking collectives, differentiable where Horovod's are.

Gradients follow Horovod: allreduce's is the allreduce (same op and factors) of
the incoming gradient; allgather's and broadcast's are the averaged incoming
gradient, sliced to this rank's rows (allgather) or zeroed off the root
(broadcast); alltoall's is the alltoall back along the received splits;
reducescatter's is the allgather of the incoming gradient, times the set size
for Sum (Horovod's definition; grouped ones alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..horovod.basics import ProcessSet, engine_of, global_process_set
from ..horovod.handle import Handle
from ..horovod.negotiation import HvdOp
from .compression import Compression, Compressor
from .ops import (
    Average,
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    blocking,
    broadcast_async,
    broadcast_async_,
    buffer_of,
    check,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    handle_average_backwards_compatibility,
    reducescatter_async,
    synchronize,
)

__all__ = [
    "allgather",
    "allreduce",
    "allreduce_",
    "alltoall",
    "broadcast",
    "broadcast_",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_reducescatter",
    "reducescatter",
    "sparse_allreduce_async",
]


def allreduce_blocking(
    tensor: torch.Tensor,
    inplace: bool,
    average: bool | None,
    name: str | None,
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> torch.Tensor:
    """``synchronize(allreduce_async(...))`` (``allreduce_async_`` when ``inplace``); a named
    small all-reduce in steady state takes the engine's steady path
    (:mod:`unison.horovod.steady`): one gathered cycle on this thread, no handle."""
    if name is not None:
        rop = handle_average_backwards_compatibility(op, average)
        t = check(tensor, "allreduce tensor")
        steady = engine_of(process_set).steady
        if steady is not None:
            out = t if inplace else torch.empty_like(t)
            if not out.requires_grad:
                src = buffer_of(t)
                dst = src if inplace else buffer_of(out)
                got = steady.allreduce(
                    src, dst, str(name), int(rop), float(prescale_factor), float(postscale_factor)
                )
                if isinstance(got, Handle):
                    synchronize(got)  # fell back after gathering: done into ``out`` too
                if got is not None:
                    return out
        average, op = None, rop
    fn = allreduce_async_ if inplace else allreduce_async
    out_: torch.Tensor = blocking(
        fn, tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return out_


def _call(fn: Any, *args: Any) -> Any:
    return fn.apply(*args)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: Any,
        op: HvdOp,
        pre: float,
        post: float,
        ps: ProcessSet,
    ) -> Any:
        ctx.args = (op, pre, post, ps)
        return allreduce_blocking(tensor, False, None, name, op, pre, post, ps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        return (
            allreduce(
                grad.contiguous(), op=op, prescale_factor=pre, postscale_factor=post, process_set=ps
            ),
            None,
            None,
            None,
            None,
            None,
        )


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Average (or ``op``) ``tensor`` over the ranks into a new tensor; differentiable.

    ``prescale_factor`` multiplies each rank's input before the reduction,
    ``postscale_factor`` the result after it (Average divides by the set size too).
    """
    rop = handle_average_backwards_compatibility(op, average)
    compressed, cctx = compression.compress(tensor)
    if isinstance(compressed, torch.Tensor) and not (
        compressed.requires_grad and torch.is_grad_enabled()
    ):  # no graph to record: the autograd Function would return the same tensor
        out = allreduce_blocking(
            compressed, False, None, name, rop, prescale_factor, postscale_factor, process_set
        )
    else:
        out = _call(
            _Allreduce, compressed, name, rop, prescale_factor, postscale_factor, process_set
        )
    return compression.decompress(out, cctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return allreduce_blocking(
        tensor, True, average, name, op, prescale_factor, postscale_factor, process_set
    )


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        name: Any,
        op: HvdOp,
        pre: float,
        post: float,
        ps: ProcessSet,
        *tensors: torch.Tensor,
    ) -> Any:
        ctx.args = (op, pre, post, ps)
        return tuple(
            blocking(grouped_allreduce_async, list(tensors), None, name, op, pre, post, ps)
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        out = grouped_allreduce(
            [g.contiguous() for g in grads],
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ps,
        )
        return (None, None, None, None, None, *out)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    rop = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outs = _call(
        _GroupedAllreduce,
        name,
        rop,
        prescale_factor,
        postscale_factor,
        process_set,
        *[p[0] for p in pairs],
    )
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    out: list[torch.Tensor] = blocking(
        grouped_allreduce_async_,
        list(tensors),
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )
    return out


def _my_offset(rows: int, ps: ProcessSet) -> int:
    dims = blocking(allgather_async, torch.tensor([rows], dtype=torch.int64), process_set=ps)
    return int(dims[: ps.rank()].sum().item())


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Any, ps: ProcessSet) -> Any:
        ctx.rows, ctx.ps = tensor.shape[0], ps
        return blocking(allgather_async, tensor, name, ps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        off = _my_offset(ctx.rows, ctx.ps)
        return reduced.narrow(0, off, ctx.rows), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 (first dims may differ)."""
    out: torch.Tensor = _call(_Allgather, tensor, name, process_set)
    return out


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: Any, ps: ProcessSet, *tensors: torch.Tensor) -> Any:
        ctx.rows, ctx.ps = [t.shape[0] for t in tensors], ps
        return tuple(blocking(grouped_allgather_async, list(tensors), name, ps))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average, process_set=ctx.ps)
        out = []
        for g, rows in zip(reduced, ctx.rows, strict=True):
            out.append(g.narrow(0, _my_offset(rows, ctx.ps), rows))
        return (None, None, *out)


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    return list(_call(_GroupedAllgather, name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root: int, name: Any, ps: ProcessSet) -> Any:
        ctx.root, ctx.ps = root, ps
        return blocking(broadcast_async, tensor, root, name, ps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from .basics import rank

        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        if rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``tensor`` of ``root_rank`` on every rank, as a new tensor; differentiable."""
    out: torch.Tensor = _call(_Broadcast, tensor, root_rank, name, process_set)
    return out


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    out: torch.Tensor = blocking(broadcast_async_, tensor, root_rank, name, process_set)
    return out


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Any, ps: ProcessSet) -> Any:
        out, received = blocking(alltoall_async, tensor, splits, name, ps)
        ctx.received, ctx.ps = received, ps
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> Any:
        back, _r = alltoall(grad.contiguous(), splits=ctx.received, process_set=ctx.ps)
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Scatter rows to every rank, gather theirs. Returns the output tensor, and with
    ``splits`` given, also the rows received from each rank (as Horovod does)."""
    return _call(_Alltoall, tensor, splits, name, process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: Any,
        op: HvdOp,
        ps: ProcessSet,
        pre: float,
        post: float,
    ) -> Any:
        ctx.op, ctx.ps = op, ps
        return blocking(reducescatter_async, tensor, name, op, ps, pre, post)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _reducescatter_grad(grad, ctx.op, ctx.ps), None, None, None, None, None


def _reducescatter_grad(grad: torch.Tensor, op: HvdOp, ps: ProcessSet) -> torch.Tensor:
    """Horovod's gradient of a reducescatter: the allgather of the incoming gradient,
    times the set size for Sum (Average: the allgather as it is)."""
    if op == HvdOp.SUM:
        grad = grad * ps.size()
    return allgather(grad.contiguous(), process_set=ps)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        name: Any,
        op: HvdOp,
        ps: ProcessSet,
        pre: float,
        post: float,
        *tensors: torch.Tensor,
    ) -> Any:
        ctx.op, ctx.ps = op, ps
        return tuple(blocking(grouped_reducescatter_async, list(tensors), name, op, ps, pre, post))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        if ctx.op == HvdOp.SUM:
            grads = tuple(g * ctx.ps.size() for g in grads)
        out = grouped_allgather([g.contiguous() for g in grads], process_set=ctx.ps)
        return (None, None, None, None, None, *out)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce over the ranks; rank i keeps the i-th block of rows of the result."""
    compressed, cctx = compression.compress(tensor)
    out = _call(
        _Reducescatter,
        compressed,
        name,
        HvdOp(int(op)),
        process_set,
        prescale_factor,
        postscale_factor,
    )
    return compression.decompress(out, cctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    pairs = [compression.compress(t) for t in tensors]
    outs = _call(
        _GroupedReducescatter,
        name,
        Average if op is None else HvdOp(int(op)),
        process_set,
        prescale_factor,
        postscale_factor,
        *[p[0] for p in pairs],
    )
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs, strict=True)]


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str, op: Any, process_set: ProcessSet = global_process_set
) -> Any:
    """Allreduce of a sparse tensor by gathering indices and values; returns a callable
    handle for :func:`synchronize`."""
    t = tensor.coalesce()
    ih = allgather_async(
        t.indices().transpose(0, 1).contiguous(), name=f"{name}.indices", process_set=process_set
    )
    vh = allgather_async(t.values().contiguous(), name=f"{name}.values", process_set=process_set)

    def finish() -> torch.Tensor:
        values = synchronize(vh)
        indices = synchronize(ih)
        if HvdOp(int(op)) == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size()).coalesce()

    return finish
