"""Executing agreed responses: the data movement, on the process set's data group.

Runs on the engine thread only. All-reduces planned into one batch by
:mod:`unison.torch.fusion` are copied (pre-scaled) into a reusable fusion
buffer, reduced as one message and copied out (post-scaled). Ranks that have
joined contribute zeros (all-reduce) or nothing (all-gather).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .. import ReduceOp
from ..comm.api import (
    Group,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    reduce_scatter_tensor,
)
from . import fusion
from .adasum import adasum_combine
from .errors import HorovodInternalError, TensorMismatchError
from .handle import Entry
from .negotiation import HvdOp, RequestKind, Response, reducescatter_rows
from .settings import Settings
from .timeline import Timeline

__all__ = ["Executor", "torch_dtype"]

_UNISON_OP = {
    HvdOp.AVERAGE: ReduceOp.SUM,
    HvdOp.SUM: ReduceOp.SUM,
    HvdOp.MIN: ReduceOp.MIN,
    HvdOp.MAX: ReduceOp.MAX,
    HvdOp.PRODUCT: ReduceOp.PRODUCT,
}


def torch_dtype(label: str) -> torch.dtype:
    dt = getattr(torch, label.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {label}")
    return dt


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def scale_(t: torch.Tensor, factor: float) -> None:
    """Multiply in place; integers are scaled in double precision and truncated."""
    if factor == 1.0 or t.numel() == 0:
        return
    if t.is_floating_point():
        t.mul_(factor)
    elif t.dtype is torch.bool:
        return
    else:
        t.copy_(torch.trunc(t.double() * factor))


def _response_error(resp: Response) -> BaseException:
    """The error an error response raises: Horovod's RuntimeError for an operation the
    joined ranks cannot take part in, a mismatch error otherwise."""
    if "is not supported with Join at this time" in resp.error:
        return HorovodInternalError(resp.error, op=resp.name)
    return TensorMismatchError(resp.error, op=resp.name)


def _execution_error(resp: Response, exc: BaseException) -> BaseException:
    """The error the handles of a failed execution get: Horovod's HorovodInternalError
    (what ``hvd.elastic.run`` recovers from), naming the operation and the lost ranks."""
    if isinstance(exc, HorovodInternalError):
        return exc
    kind = resp.request.kind.name.lower()
    return HorovodInternalError(
        f"{kind} of {resp.name!r} failed: {exc}",
        op=resp.name,
        ranks=getattr(exc, "ranks", ()) or (),
    )


class Executor:
    def __init__(
        self,
        group: Group,
        ranks: list[int],
        me: int,
        settings: Settings,
        timeline: Timeline | None,
    ) -> None:
        self.group = group
        self.ranks = ranks
        self.size = len(ranks)
        self.me = me
        self.settings = settings
        self.timeline = timeline
        self._fusion: dict[torch.dtype, torch.Tensor] = {}
        self.collectives = 0  # data collectives issued (a count for tests and profiles)

    def close(self) -> None:
        self._fusion.clear()

    # --- dispatch ----------------------------------------------------------------------
    def run(self, responses: list[Response], entries: list[Entry | None]) -> None:
        """Execute the agreed ``responses``. When one fails (a lost peer), every handle
        of this run still unfinished fails with the error before it is raised: the
        engine has taken these entries off its pending table, so nobody else would."""
        nbytes = [
            sum(_numel(s) for s in r.request.shapes)
            * (torch_dtype(r.request.dtype).itemsize if r.request.dtype else 0)
            for r in responses
        ]
        batches = fusion.plan(responses, nbytes, self.settings.fusion_threshold)
        for b, batch in enumerate(batches):
            resps = [responses[i] for i in batch]
            ents = [entries[i] for i in batch]
            try:
                self._run_batch(resps, ents)
            except BaseException as exc:
                err = _execution_error(resps[0], exc)
                for rest in batches[b:]:
                    for i in rest:
                        e = entries[i]
                        if e is not None:
                            e.handle.finish(error=err)
                if err is exc:
                    raise
                raise err from exc

    def _run_batch(self, resps: list[Response], ents: list[Entry | None]) -> None:
        first = resps[0]
        if first.error:
            for e in ents:
                if e is not None:
                    e.handle.finish(error=_response_error(first))
            return
        kind = first.request.kind
        if kind is not RequestKind.JOIN:
            self.collectives += 1
        start = time.perf_counter()
        self._queue_spans(resps, ents, start)
        out: list[Any]
        if kind is RequestKind.ALLREDUCE:
            if first.request.op == HvdOp.ADASUM:
                out = [self._adasum(first, ents[0])]
            else:
                out = self._allreduce(resps, ents)
        elif kind is RequestKind.ALLGATHER:
            out = [self._allgather(first, ents[0])]
        elif kind is RequestKind.BROADCAST:
            out = [self._broadcast(first, ents[0])]
        elif kind is RequestKind.ALLTOALL:
            out = [self._alltoall(first, ents[0])]
        elif kind is RequestKind.REDUCESCATTER:
            out = [self._reducescatter(first, ents[0])]
        elif kind is RequestKind.BARRIER:
            barrier(self.group)
            out = [None]
        else:  # JOIN
            out = [self.ranks[first.value] if first.value >= 0 else -1]
        if kind not in (RequestKind.ALLREDUCE, RequestKind.JOIN):
            self._span(first.name, kind.name, start, time.perf_counter())
        for e, produced in zip(ents, out, strict=True):
            if e is not None:
                e.handle.finish(e.finish(e, produced))

    def _span(self, name: str, phase: str, start: float, end: float, **args: Any) -> None:
        if self.timeline is not None:
            self.timeline.span(name, phase, start, end, **args)

    def _queue_spans(self, resps: list[Response], ents: list[Entry | None], start: float) -> None:
        if self.timeline is None:
            return
        for r, e in zip(resps, ents, strict=True):
            if e is None:
                continue
            self._span(r.name, f"NEGOTIATE_{r.request.kind.name}", e.enqueued, e.decided)
            self._span(r.name, "QUEUE", e.decided, start)

    # --- all-reduce ---------------------------------------------------------------------------
    def _tensors(
        self, resp: Response, e: Entry | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if e is not None:
            assert e.outputs is not None
            return list(e.inputs), list(e.outputs)
        dt = torch_dtype(resp.request.dtype)
        zeros = [torch.zeros(s, dtype=dt) for s in resp.request.shapes]
        return zeros, zeros

    def _buffer(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        buf = self._fusion.get(dtype)
        if buf is None or buf.numel() < n:
            buf = torch.empty(max(n, 1024), dtype=dtype)
            self._fusion[dtype] = buf
        return buf[:n]

    def _allreduce(self, resps: list[Response], ents: list[Entry | None]) -> list[Any]:
        q = resps[0].request
        ins: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        for r, e in zip(resps, ents, strict=True):
            i, o = self._tensors(r, e)
            ins += i
            outs += o
        post = q.postscale / self.size if q.op == HvdOp.AVERAGE else q.postscale
        uop = _UNISON_OP[HvdOp(q.op)]
        t0 = time.perf_counter()
        if len(ins) == 1:
            buf = outs[0]
            if buf.data_ptr() != ins[0].data_ptr():
                buf.copy_(ins[0])
            scale_(buf, q.prescale)
            t1 = time.perf_counter()
            all_reduce(buf, uop, self.group)
            t2 = time.perf_counter()
            scale_(buf, post)
            t3 = time.perf_counter()
        else:
            total = sum(t.numel() for t in ins)
            buf = self._buffer(ins[0].dtype, total)
            # floating point: the scaling rides on the copy in and out (one pass over the
            # bytes instead of two; the same multiplication, so the same bits)
            fold = buf.is_floating_point()
            off = 0
            for t in ins:
                n = t.numel()
                if fold and q.prescale != 1.0:
                    torch.mul(t.reshape(-1), q.prescale, out=buf[off : off + n])
                else:
                    buf[off : off + n].copy_(t.reshape(-1))
                off += n
            if not fold:
                scale_(buf, q.prescale)
            t1 = time.perf_counter()
            all_reduce(buf, uop, self.group)
            t2 = time.perf_counter()
            if not fold:
                scale_(buf, post)
            off = 0
            for t in outs:
                n = t.numel()
                if fold and post != 1.0:
                    torch.mul(buf[off : off + n], post, out=t.view(-1))
                else:
                    t.view(-1).copy_(buf[off : off + n])
                off += n
            t3 = time.perf_counter()
        if self.timeline is not None:
            fused = len(ins) > 1
            for r in resps:
                if fused:
                    self._span(r.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
                self._span(r.name, "ALLREDUCE", t1, t2, fused=len(resps))
                if fused:
                    self._span(r.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3)
        return [list(e.outputs) if e is not None and e.outputs is not None else None for e in ents]

    def _adasum(self, resp: Response, e: Entry | None) -> list[torch.Tensor]:
        q = resp.request
        ins, outs = self._tensors(resp, e)
        t0 = time.perf_counter()
        for i, o in zip(ins, outs, strict=True):
            mine = i.reshape(-1).to(torch.float64) * q.prescale
            everyone = torch.empty(self.size * mine.numel(), dtype=torch.float64)
            all_gather_into_tensor(everyone, mine.contiguous(), self.group)
            combined = adasum_combine(list(everyone.view(self.size, -1).unbind(0)))
            o.view(-1).copy_((combined * q.postscale).to(o.dtype))
        self._span(resp.name, "ADASUM_ALLREDUCE", t0, time.perf_counter())
        return outs

    # --- the others ---------------------------------------------------------------------------
    def _allgather(self, resp: Response, e: Entry | None) -> list[torch.Tensor]:
        q = resp.request
        dt = torch_dtype(q.dtype)
        outs: list[torch.Tensor] = []
        for j, shape in enumerate(q.shapes):
            rest = tuple(shape[1:])
            rows = [resp.per_rank[r][j] for r in range(self.size)]
            out = torch.empty((sum(rows), *rest), dtype=dt)
            mine = e.inputs[j] if e is not None else torch.empty((0, *rest), dtype=dt)
            if self.size == 1:
                out.copy_(mine)
            else:
                pieces = list(torch.split(out, rows, dim=0))
                all_to_all(pieces, [mine] * self.size, self.group)
            outs.append(out)
        return outs

    def _broadcast(self, resp: Response, e: Entry | None) -> list[torch.Tensor]:
        ins, outs = self._tensors(resp, e)
        for i, o in zip(ins, outs, strict=True):
            if o.data_ptr() != i.data_ptr():
                o.copy_(i)
            broadcast(o, resp.request.root, self.group)
        return outs

    def _alltoall(self, resp: Response, e: Entry | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert e is not None
        t = e.inputs[0]
        # the response carries the first rank's request: this rank's own splits are its row
        sends = list(resp.per_rank[self.me])
        recv = [resp.per_rank[r][self.me] for r in range(self.size)]
        out = torch.empty((sum(recv), *t.shape[1:]), dtype=t.dtype)
        ins = list(torch.split(t, sends, dim=0))
        outs = list(torch.split(out, recv, dim=0))
        if self.size == 1:
            out.copy_(t)
        else:
            all_to_all(outs, ins, self.group)
        return out, torch.tensor(recv, dtype=torch.int32)

    def _reducescatter(self, resp: Response, e: Entry | None) -> list[torch.Tensor]:
        assert e is not None
        q = resp.request
        post = q.postscale / self.size if q.op == HvdOp.AVERAGE else q.postscale
        outs: list[torch.Tensor] = []
        for t in e.inputs:
            rows = reducescatter_rows(t.shape[0], self.size)
            width = rows[0]
            rest = tuple(t.shape[1:])
            padded = torch.zeros((self.size * width, *rest), dtype=t.dtype)
            off = 0
            for r, n in enumerate(rows):
                padded[r * width : r * width + n].copy_(t[off : off + n])
                off += n
            scale_(padded, q.prescale)
            part = torch.empty((width, *rest), dtype=t.dtype)
            reduce_scatter_tensor(part, padded, _UNISON_OP[HvdOp(q.op)], self.group)
            out = part[: rows[self.me]].clone()
            scale_(out, post)
            outs.append(out)
        return outs
