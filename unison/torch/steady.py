"""The steady-state blocking all-reduce: one gathered cycle on the caller's thread.

In steady state every rank's last cycle promised that the next one is gathered
(:mod:`unison.torch.record`), and a training or benchmark loop calls the same named
small all-reduce again and again. Such a call, made while the engine is idle, is one
cycle whose every message is known in advance except for the tensor's bytes: the
cache bit of its response, one inline part. :class:`SteadyPath` writes this rank's
record from a template kept per name (the layout :func:`~unison.torch.record.encode`
writes, byte for byte), copies the tensor's bytes into it, runs the cycle's one
``all_gather`` and, when every rank's record has the same head (same flags, cycle,
bits and part: every rank sent this tensor and nothing else, steady), reduces the
gathered bytes in rank order straight into the output tensor (as
:func:`~unison.torch.inline.reduce_inline`, the same operations in the same order, so
the same bits). No Handle, no Entry, no message tuples, no decoding.

Anything else falls back to the general cycle with the same gathered records: a
different head on any rank (another tensor, an idle rank's empty record, a goodbye, a
message sent point to point) is decoded and decided by
:func:`unison.torch.cycle.decide`, exactly as :func:`~unison.torch.cycle.run_cycle`
would have, with the call's operation pending like any other; the caller then waits on
its handle. A call that does not qualify (the engine busy, the next cycle not gathered,
a timeline being written, a tensor not in the response cache or too large to ride
inline, ...) takes the general path before anything is sent.
"""

from __future__ import annotations

import ctypes
import struct
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .cache import ids_to_bits
from .execute import torch_dtype
from .handle import Entry, Handle
from .inline import _BY_LABEL, _OPS, INLINE_BUDGET, _scaled
from .negotiation import HvdOp, RequestKind, Response
from .record import RECORD_BYTES, encode

if TYPE_CHECKING:
    from .engine import TorchEngine

__all__ = ["SteadyPath"]

_copy = ctypes.memmove
_K = struct.Struct("<I")  # the cycle number's place in a record head (offset 4)
_UFUNC = {
    int(HvdOp.SUM): np.add,
    int(HvdOp.AVERAGE): np.add,
    int(HvdOp.MIN): np.minimum,
    int(HvdOp.MAX): np.maximum,
    int(HvdOp.PRODUCT): np.multiply,
}


class _Plan:
    """One cached response's steady call: its record head, views of the records, and
    scratch arrays for the reduction (two, so no ufunc's output aliases its input)."""

    __slots__ = (
        "addr",
        "bits",
        "bufs",
        "cid",
        "dtype",
        "float",
        "head",
        "heads",
        "hlen",
        "holders",
        "mine",
        "mine_addr",
        "n",
        "op",
        "parts",
        "post",
        "post_arr",
        "pre",
        "pre_arr",
        "resp",
        "shape",
        "ufunc",
    )

    def __init__(self, resp: Response, cid: int, path: SteadyPath) -> None:
        q = resp.request
        self.resp = resp
        self.cid = cid
        self.dtype = torch_dtype(q.dtype)
        self.shape = q.shapes[0]
        self.op = q.op
        self.pre = q.prescale
        self.post = q.postscale / path.size if q.op == HvdOp.AVERAGE else q.postscale
        npdt = _BY_LABEL[q.dtype]
        self.float = npdt.kind == "f"
        # a float factor as a one-element array of the tensor's type: numpy multiplies by
        # a Python float in the array's precision (what inline._scaled does), and an
        # array operand skips the scalar conversion
        # (used for floats only; integers are scaled in double precision and truncated)
        self.pre_arr = np.array([self.pre if self.float else 0], npdt)
        self.post_arr = np.array([self.post if self.float else 0], npdt)
        count = int(np.prod(self.shape, dtype=np.int64))
        self.n = n = count * npdt.itemsize
        bits = ids_to_bits({cid})
        scratch = np.zeros(RECORD_BYTES, np.uint8)
        msg: tuple[Any, ...] = ("C", 0, bits, [], {}, {q.name: bytes(n)}, True)
        ok = encode(msg, path.engine.cache, scratch)  # the cache names q.name ``cid``
        assert ok, "checked by SteadyPath._build"
        self.hlen = hlen = _used(bits, n) - n
        self.head = scratch[:hlen].copy()
        everyone = path.engine.lanes.everyone
        me = path.engine.me
        rb = RECORD_BYTES
        self.parts = [
            everyone[r * rb + hlen : r * rb + hlen + n].view(npdt) for r in range(path.size)
        ]
        self.mine = path.engine.lanes.rec[hlen : hlen + n].view(npdt)
        self.mine_addr = self.mine.ctypes.data
        self.heads = [everyone[r * rb : r * rb + hlen] for r in range(path.size) if r != me]
        self.ufunc = _UFUNC[q.op]
        self.bits = bits
        self.bufs = (np.empty(count, npdt), np.empty(count, npdt))
        self.addr = (self.bufs[0].ctypes.data, self.bufs[1].ctypes.data)
        self.holders = {q.name: set(range(path.size))}


def _used(bits: bytes, n: int) -> int:
    """Bytes of a record carrying ``bits`` and one part of ``n`` bytes."""
    return struct.calcsize("<B3xIHH") + len(bits) + struct.calcsize("<II") + n


class SteadyPath:
    """The engine's steady-state blocking all-reduce (see the module docstring)."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        self.size = engine.size
        self._plans: dict[str, _Plan] = {}
        #: calls completed on the steady path, and those that fell back after gathering
        self.taken = 0
        self.fell_back = 0

    def _plan(self, name: str) -> _Plan | None:
        cache = self.engine.cache
        cid = cache.id_of(name)
        if cid is None:
            return None
        resp = cache.get(cid)
        p = self._plans.get(name)
        if p is not None and p.resp is resp and p.cid == cid:
            return p
        p = self._build(resp, cid)
        if p is None:
            self._plans.pop(name, None)
        else:
            if len(self._plans) >= 4 * max(16, cache.capacity):
                self._plans.clear()
            self._plans[name] = p
        return p

    def _build(self, resp: Response, cid: int) -> _Plan | None:
        q = resp.request
        if resp.error or resp.joined or q.kind is not RequestKind.ALLREDUCE or q.op not in _OPS:
            return None
        if len(q.shapes) != 1 or q.dtype not in _BY_LABEL:
            return None
        n = int(np.prod(q.shapes[0], dtype=np.int64)) * _BY_LABEL[q.dtype].itemsize
        if n == 0 or n > INLINE_BUDGET or _used(ids_to_bits({cid}), n) > RECORD_BYTES:
            return None
        return _Plan(resp, cid, self)

    def allreduce(
        self,
        t: torch.Tensor,
        out: torch.Tensor,
        name: str,
        op: int,
        pre: float,
        post: float,
    ) -> Any:
        """All-reduce ``t`` into ``out`` (validated tensors): ``out`` when done here; a
        Handle to synchronize when the cycle fell back to the general path after
        gathering; None when the call does not qualify (nothing was sent: submit it)."""
        e = self.engine
        with e._cv:
            if (
                not e._lane_next
                or e._running
                or e._pending
                or e._new
                or e._kick
                or e._force
                or e._error is not None
                or e._closing
                or e.timeline is not None
                or e.coord.busy
                or not e.lanes.enabled
                or e.settings.cycle_time > 0
            ):
                return None
            p = self._plan(name)
            if (
                p is None
                or t.dtype is not p.dtype
                or t.shape != p.shape
                or op != p.op
                or pre != p.pre
                or post != p.resp.request.postscale
                or out.requires_grad
            ):
                return None
            e._running = True
        done = None
        try:
            done = self._run(p, t, out)
            return done
        except BaseException as exc:
            e._fail_all(exc)
            err = e._error
            raise err if err is not None else exc from None
        finally:
            with e._cv:
                if done is out:  # who submitted what: every rank this, now decided
                    att = e._attendance
                    att.last_bits = [p.bits] * self.size
                    if att.seen:
                        att.seen.pop(p.resp.request.name, None)
                e._running = False
                if e._new or e._pending or e._kick or e._error or (e._cycle + 1) in e._inbox:
                    e._cv.notify_all()
                if e._has_work() or (e._lane_next and not e.channel.watching):
                    e.channel.watch()

    def _run(self, p: _Plan, t: torch.Tensor, out: torch.Tensor) -> Any:
        e = self.engine
        lanes = e.lanes
        k = e._cycle + 1
        rec = lanes.rec
        rec[: p.hlen] = p.head
        _K.pack_into(lanes.view, 4, k & 0xFFFFFFFF)
        if p.pre == 1.0:
            _copy(p.mine_addr, t.data_ptr(), p.n)
        elif p.float:
            np.multiply(t.detach().numpy().reshape(-1), p.pre_arr, p.mine)
        else:
            p.mine[...] = _scaled(t.detach().numpy().reshape(-1), p.pre)
        counts = e.counts
        counts["cycles"] += 1
        counts["caller"] += 1
        counts["lane"] += 1
        e._last_sent = time.monotonic()
        lanes.gather(k, e.ranks)
        head = rec[: p.hlen].tobytes()
        for h in p.heads:
            if h.tobytes() != head:
                return self._fall_back(p, t, out, k)
        e._cycle = k
        e.channel.listen = True  # _lane_next stays: every message was steady, all decided
        # as inline.reduce_inline: rank order, then the post-scaling (between two buffers)
        parts, bufs, ufunc = p.parts, p.bufs, p.ufunc
        ufunc(parts[0], parts[1], bufs[0])
        cur = 0
        for v in parts[2:]:
            ufunc(bufs[cur], v, bufs[1 - cur])
            cur = 1 - cur
        if p.post != 1.0:
            if p.float:
                np.multiply(bufs[cur], p.post_arr, bufs[1 - cur])
            else:
                bufs[1 - cur][...] = _scaled(bufs[cur], p.post)
            cur = 1 - cur
        _copy(out.data_ptr(), p.addr[cur], p.n)
        if e._lead and e._holders is not p.holders:
            e._holders = p.holders  # the stall inspector: every rank holds it, no stall
            e.stall.observe(p.holders, time.monotonic())
        counts["inline"] += 1
        e.cache.put(p.resp)
        e._ended = time.monotonic()
        self.taken += 1
        return out

    def _fall_back(self, p: _Plan, t: torch.Tensor, out: torch.Tensor, k: int) -> Handle:
        """The gathered records differ from ours: the general decision, as
        :func:`~unison.torch.cycle.run_cycle` makes it, with this call pending."""
        from .cycle import decide, lane_after
        from .ops import _first

        e = self.engine
        self.fell_back += 1
        q = p.resp.request
        handle = Handle(q.name, keep=([t], [out]), engine=e)
        entry = Entry(q, [t], [out], handle, _first)
        with e._cv:
            e._pending[q.name] = entry
        n = p.mine.nbytes
        part = e.lanes.rec[p.hlen : p.hlen + n].tobytes()
        mine: tuple[Any, ...] = ("C", k, p.bits, [], {}, {q.name: part}, True)
        msgs = lane_after(e, k, *e.lanes.decode_all(k, e.cache, e.ranks))
        msgs[e.me] = mine
        decide(e, k, msgs)
        return handle
