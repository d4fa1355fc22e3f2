"""Executing agreed responses: the data movement, on the process set's data group.

:class:`ResponseRunner` runs on whichever thread runs the cycle (one at a time).
All-reduces planned into one batch by :mod:`unison.horovod.fusion` are reduced as
one buffer: where the engine's shared-memory algorithms run them, straight from and
into the tensors (:class:`unison.buffers.pieces.Pieces`; the post-scaling rides on
the result), otherwise copied (pre-scaled) into a reusable fusion buffer, reduced as
one message and copied out (post-scaled). Ranks that have joined contribute zeros
(all-reduce) or nothing (all-gather). Buffers are :class:`unison.buffers.Buffer` views;
new results (all-gather, all-to-all, reduce-scatter) are new numpy-backed buffers the
front end wraps.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from .._types import ReduceOp
from ..buffers import Buffer, DType
from ..comm.api import (
    Group,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    reduce_scatter_tensor,
)
from ..comm.collectives import all_reduce_pieces
from . import fusion
from .adasum import adasum_combine
from .arrays import (
    COMM_OP,
    as_float64,
    dtype_of,
    from_float64,
    new_buffer,
    numel,
    payload,
    reduce_bf16,
    scale,
    zeros,
)
from .errors import HorovodInternalError, TensorMismatchError
from .handle import Entry
from .negotiation import HvdOp, RequestKind, Response, reducescatter_rows
from .settings import Settings
from .timeline import Timeline

__all__ = ["ResponseRunner"]


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


def _rows_view(b: Buffer, start: int, rows: int, width: int) -> np.ndarray:
    return b.array[start * width : (start + rows) * width]


class ResponseRunner:
    """Moves the data of agreed responses (see the module docstring)."""

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
        self._fusion: dict[DType, np.ndarray] = {}
        self.collectives = 0  # data collectives issued (a count for tests and profiles)
        self.packed = 0  # batches copied through the fusion buffer (likewise)

    def close(self) -> None:
        self._fusion.clear()

    # --- dispatch ----------------------------------------------------------------------
    def run(self, responses: list[Response], entries: list[Entry | None]) -> None:
        """Execute the agreed ``responses``. When one fails (a lost peer), every handle
        of this run still unfinished fails with the error before it is raised: the
        engine has taken these entries off its pending table, so nobody else would."""
        nbytes = [
            sum(numel(s) for s in r.request.shapes)
            * (dtype_of(r.request.dtype).itemsize if r.request.dtype else 0)
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
        self.queue_spans(resps, ents, start)
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
            self.span(first.name, kind.name, start, time.perf_counter())
        for e, produced in zip(ents, out, strict=True):
            if e is not None:
                e.handle.finish(e.finish(e, produced))

    # --- the timeline -------------------------------------------------------------------------
    def span(self, name: str, phase: str, start: float, end: float, **args: Any) -> None:
        """One timeline span (nothing when no timeline is being written)."""
        if self.timeline is not None:
            self.timeline.span(name, phase, start, end, **args)

    def queue_spans(self, resps: list[Response], ents: list[Entry | None], start: float) -> None:
        """The negotiation and queueing spans of ``resps`` (execution starts at ``start``)."""
        if self.timeline is None:
            return
        for r, e in zip(resps, ents, strict=True):
            if e is None:
                continue
            self.span(r.name, f"NEGOTIATE_{r.request.kind.name}", e.enqueued, e.decided)
            self.span(r.name, "QUEUE", e.decided, start)

    # --- all-reduce ---------------------------------------------------------------------------
    def _buffers(self, resp: Response, e: Entry | None) -> tuple[list[Buffer], list[Buffer]]:
        if e is not None:
            assert e.outputs is not None
            return list(e.inputs), list(e.outputs)
        dt = dtype_of(resp.request.dtype)
        zs = [zeros(dt, s) for s in resp.request.shapes]
        return zs, zs

    def _fusion_buffer(self, dtype: DType, n: int) -> Buffer:
        arr = self._fusion.get(dtype)
        if arr is None or arr.shape[0] < n:
            arr = np.empty(max(n, 1024), dtype.storage)
            self._fusion[dtype] = arr
        view = arr[:n]
        return Buffer(view, dtype, view)

    def _allreduce(self, resps: list[Response], ents: list[Entry | None]) -> list[Any]:
        q = resps[0].request
        ins: list[Buffer] = []
        outs: list[Buffer] = []
        for r, e in zip(resps, ents, strict=True):
            i, o = self._buffers(r, e)
            ins += i
            outs += o
        dt = ins[0].dtype
        post = q.postscale / self.size if q.op == HvdOp.AVERAGE else q.postscale
        uop = COMM_OP[HvdOp(q.op)]
        t0 = time.perf_counter()
        if dt is DType.BFLOAT16:
            return self._allreduce_bf16(resps, ents, ins, outs, t0)
        copied = False  # through the fusion buffer
        if len(ins) == 1:
            buf = outs[0]
            scale(ins[0].array, dt, q.prescale, out=buf.array)  # the copy, where one is due
            t1 = time.perf_counter()
            all_reduce(payload(buf), uop, self.group)
            t2 = time.perf_counter()
            scale(buf.array, dt, post)
            t3 = time.perf_counter()
        elif self._where_they_lie(ins, outs, dt, q.prescale, uop, post):
            t1, t2 = t0, time.perf_counter()  # no copies: all in the all-reduce
            t3 = t2
        else:
            copied = True
            self.packed += 1
            total = sum(b.count for b in ins)
            buf = self._fusion_buffer(dt, total)
            fused = buf.array
            # the scaling rides on the copy in and out (one pass over the bytes)
            off = 0
            for b in ins:
                scale(b.array, dt, q.prescale, out=fused[off : off + b.count])
                off += b.count
            t1 = time.perf_counter()
            all_reduce(payload(buf), uop, self.group)
            t2 = time.perf_counter()
            off = 0
            for b in outs:
                scale(fused[off : off + b.count], dt, post, out=b.array)
                off += b.count
            t3 = time.perf_counter()
        if self.timeline is not None:
            for r in resps:
                if copied:
                    self.span(r.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
                self.span(r.name, "ALLREDUCE", t1, t2, fused=len(resps))
                if copied:
                    self.span(r.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3)
        return [list(e.outputs) if e is not None and e.outputs is not None else None for e in ents]

    def _where_they_lie(
        self,
        ins: list[Buffer],
        outs: list[Buffer],
        dt: DType,
        prescale: float,
        uop: Any,
        post: float,
    ) -> bool:
        """Reduce the batch's tensors as one where they lie, without the fusion buffer's
        copies in and out (the engine's shared-memory path copies through its shared
        slots anyway); the post-scaling rides on the result. False, with nothing done,
        where that cannot be: a pre-scale, tensors that share memory, an engine or size
        that needs one buffer."""
        if prescale != 1.0:
            return False
        finish = None if post == 1.0 else functools.partial(scale, dtype=dt, factor=post)
        srcs = [b.array for b in ins]
        return all_reduce_pieces(self.group, srcs, [o.array for o in outs], dt, uop, finish)

    def _allreduce_bf16(
        self,
        resps: list[Response],
        ents: list[Entry | None],
        ins: list[Buffer],
        outs: list[Buffer],
        t0: float,
    ) -> list[Any]:
        """bfloat16: every rank's (pre-scaled) parts gathered, then reduced in rank order
        here (numpy has no bfloat16 kernels; this needs no torch)."""
        q = resps[0].request
        post = q.postscale / self.size if q.op == HvdOp.AVERAGE else q.postscale
        total = sum(b.count for b in ins)
        mine = np.empty(total, np.int16)
        off = 0
        for b in ins:
            scale(b.array, DType.BFLOAT16, q.prescale, out=mine[off : off + b.count])
            off += b.count
        everyone = np.empty(self.size * total, np.int16)
        t1 = time.perf_counter()
        all_gather_into_tensor(everyone, mine, self.group)
        t2 = time.perf_counter()
        flat = reduce_bf16(list(everyone.reshape(self.size, total)), q.op)
        off = 0
        for b in outs:
            scale(flat[off : off + b.count], DType.BFLOAT16, post, out=b.array)
            off += b.count
        if self.timeline is not None:
            for r in resps:
                self.span(r.name, "ALLREDUCE", t1, t2, fused=len(resps))
        del t0
        return [list(e.outputs) if e is not None and e.outputs is not None else None for e in ents]

    def _adasum(self, resp: Response, e: Entry | None) -> list[Buffer]:
        q = resp.request
        ins, outs = self._buffers(resp, e)
        t0 = time.perf_counter()
        for i, o in zip(ins, outs, strict=True):
            mine = as_float64(i) * q.prescale
            everyone = np.empty(self.size * mine.shape[0], np.float64)
            all_gather_into_tensor(everyone, mine, self.group)
            combined = adasum_combine(list(everyone.reshape(self.size, -1)))
            o.array[...] = from_float64(combined * q.postscale, o.dtype)
        self.span(resp.name, "ADASUM_ALLREDUCE", t0, time.perf_counter())
        return outs

    # --- the others ---------------------------------------------------------------------------
    def _allgather(self, resp: Response, e: Entry | None) -> list[Buffer]:
        q = resp.request
        dt = dtype_of(q.dtype)
        outs: list[Buffer] = []
        for j, shape in enumerate(q.shapes):
            rest = tuple(shape[1:])
            width = numel(rest)
            rows = [resp.per_rank[r][j] for r in range(self.size)]
            out = new_buffer(dt, (sum(rows), *rest))
            mine = e.inputs[j].array if e is not None else np.empty(0, dt.storage)
            if self.size == 1:
                out.array[...] = mine
            else:
                pieces = []
                at = 0
                for n in rows:
                    pieces.append(_rows_view(out, at, n, width))
                    at += n
                all_to_all(pieces, [mine] * self.size, self.group)
            outs.append(out)
        return outs

    def _broadcast(self, resp: Response, e: Entry | None) -> list[Buffer]:
        ins, outs = self._buffers(resp, e)
        for i, o in zip(ins, outs, strict=True):
            if o.array is not i.array:
                np.copyto(o.array, i.array)
            broadcast(o.array, resp.request.root, self.group)
        return outs

    def _alltoall(self, resp: Response, e: Entry | None) -> tuple[Buffer, np.ndarray]:
        assert e is not None
        b = e.inputs[0]
        shape = b.shape
        width = numel(shape[1:])
        # the response carries the first rank's request: this rank's own splits are its row
        sends = list(resp.per_rank[self.me])
        recv = [resp.per_rank[r][self.me] for r in range(self.size)]
        out = new_buffer(b.dtype, (sum(recv), *shape[1:]))
        if self.size == 1:
            out.array[...] = b.array[: out.count]
        else:
            ins, outs = [], []
            at_in = at_out = 0
            for s, r in zip(sends, recv, strict=True):
                ins.append(_rows_view(b, at_in, s, width))
                outs.append(_rows_view(out, at_out, r, width))
                at_in += s
                at_out += r
            all_to_all(outs, ins, self.group)
        return out, np.asarray(recv, np.int32)

    def _reducescatter(self, resp: Response, e: Entry | None) -> list[Buffer]:
        assert e is not None
        q = resp.request
        post = q.postscale / self.size if q.op == HvdOp.AVERAGE else q.postscale
        uop: ReduceOp = COMM_OP[HvdOp(q.op)]
        outs: list[Buffer] = []
        for b in e.inputs:
            shape = b.shape
            rows = reducescatter_rows(shape[0], self.size)
            width = rows[0]
            rest = tuple(shape[1:])
            w = numel(rest)
            padded = zeros(b.dtype, (self.size * width, *rest))
            off = 0
            for r, n in enumerate(rows):
                _rows_view(padded, r * width, n, w)[...] = _rows_view(b, off, n, w)
                off += n
            scale(padded.array, b.dtype, q.prescale)
            part = new_buffer(b.dtype, (width, *rest))
            if b.dtype is DType.BFLOAT16:  # gathered and reduced here, as in _allreduce_bf16
                n = padded.count
                everyone = np.empty(self.size * n, np.int16)
                all_gather_into_tensor(everyone, padded.array, self.group)
                full = reduce_bf16(list(everyone.reshape(self.size, n)), q.op)
                part.array[...] = _rows_view(Buffer(full, b.dtype, full), self.me * width, width, w)
            else:
                reduce_scatter_tensor(payload(part), payload(padded), uop, self.group)
            out = new_buffer(b.dtype, (rows[self.me], *rest))
            out.array[...] = part.array[: out.count]
            scale(out.array, b.dtype, post)
            outs.append(out)
        return outs
