"""The steady-state blocking all-reduce: one gathered cycle on the caller's thread.

In steady state every rank's last cycle promised that the next one is gathered
(:mod:`unison.horovod.record`), and a training or benchmark loop calls the same named
small all-reduce again and again. Such a call, made while the engine is idle, is one
cycle whose every message is known in advance except for the tensor's bytes: the
cache bit of its response, one inline part. :class:`SteadyAllreduce` writes this rank's
record from a template kept per name (the layout :func:`~unison.horovod.record.encode`
writes, byte for byte), copies the buffer's bytes into it, runs the cycle's one
``all_gather`` and, when every rank's record has the same head (same flags, cycle,
bits and part: every rank sent this tensor and nothing else, steady), reduces the
gathered bytes in rank order into the output buffer (as
:func:`~unison.horovod.carried.reduce`, the same kernels in the same order, so
the same bits). No Handle, no Entry, no message tuples, no decoding.

Anything else falls back to the general cycle with the same gathered records: a
different head on any rank (another tensor, an idle rank's empty record, a goodbye, a
message sent point to point) is decoded and decided by
:meth:`HorovodEngine.decide`, exactly as :meth:`HorovodEngine.run_cycle`
would have, with the call's operation pending like any other; the caller then waits on
its handle. A call that does not qualify (the engine busy, the next cycle not gathered,
a timeline being written, a buffer not in the response cache or too large to ride
inline, ...) takes the general path before anything is sent.
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffers import Buffer
from .arrays import dtype_of, numel, reduce_kernel, scale
from .cache import ids_to_bits
from .carried import CARRY_BUDGET, CARRY_DTYPES, CARRY_OPS
from .handle import Entry, Handle
from .negotiation import HvdOp, RequestKind, Response
from .record import RECORD_BYTES, encode

if TYPE_CHECKING:
    from .engine import HorovodEngine

__all__ = ["SteadyAllreduce"]

_K = struct.Struct("<I")  # the cycle number's place in a record head (offset 4)


def _first(_: Entry, produced: Any) -> Any:
    return produced[0]


class _Template:
    """One cached response's steady call: its record head, views of the records, and
    scratch arrays for the reduction (two, so no kernel's output aliases its input)."""

    __slots__ = (
        "bits",
        "bufs",
        "cid",
        "dtype",
        "head",
        "heads",
        "hlen",
        "holders",
        "kernel",
        "mine",
        "n",
        "op",
        "parts",
        "post",
        "pre",
        "resp",
        "shape",
    )

    def __init__(self, resp: Response, cid: int, path: SteadyAllreduce) -> None:
        q = resp.request
        engine = path.engine
        self.resp = resp
        self.cid = cid
        self.dtype = dt = dtype_of(q.dtype)
        self.shape = q.shapes[0]
        self.op = q.op
        self.pre = q.prescale
        self.post = q.postscale / path.size if q.op == HvdOp.AVERAGE else q.postscale
        npdt = dt.storage
        count = numel(self.shape)
        self.n = n = count * npdt.itemsize
        bits = ids_to_bits({cid})
        scratch = np.zeros(RECORD_BYTES, np.uint8)
        msg: tuple[Any, ...] = ("C", 0, bits, [], {}, {q.name: bytes(n)}, True)
        ok = encode(msg, engine.cache, scratch)  # the cache names q.name ``cid``
        assert ok, "checked by SteadyAllreduce._build"
        self.hlen = hlen = _used(bits, n) - n
        self.head = scratch[:hlen].copy()
        everyone = engine.gathered.everyone
        me = engine.me
        rb = RECORD_BYTES
        self.parts = [
            everyone[r * rb + hlen : r * rb + hlen + n].view(npdt) for r in range(path.size)
        ]
        self.mine = engine.gathered.rec[hlen : hlen + n].view(npdt)
        self.heads = [everyone[r * rb : r * rb + hlen] for r in range(path.size) if r != me]
        self.kernel = reduce_kernel(q.op, dt)
        self.bits = bits
        self.bufs = (np.empty(count, npdt), np.empty(count, npdt))
        self.holders = {q.name: set(range(path.size))}


def _used(bits: bytes, n: int) -> int:
    """Bytes of a record carrying ``bits`` and one part of ``n`` bytes."""
    return struct.calcsize("<B3xIHH") + len(bits) + struct.calcsize("<II") + n


class SteadyAllreduce:
    """The engine's steady-state blocking all-reduce (see the module docstring)."""

    def __init__(self, engine: HorovodEngine) -> None:
        self.engine = engine
        self.size = engine.size
        self._templates: dict[str, _Template] = {}
        #: calls completed on the steady path, and those that fell back after gathering
        self.taken = 0
        self.fell_back = 0

    def _template(self, name: str) -> _Template | None:
        cache = self.engine.cache
        cid = cache.id_of(name)
        if cid is None:
            return None
        resp = cache.get(cid)
        p = self._templates.get(name)
        if p is not None and p.resp is resp and p.cid == cid:
            return p
        p = self._build(resp, cid)
        if p is None:
            self._templates.pop(name, None)
        else:
            if len(self._templates) >= 4 * max(16, cache.capacity):
                self._templates.clear()
            self._templates[name] = p
        return p

    def _build(self, resp: Response, cid: int) -> _Template | None:
        q = resp.request
        if resp.error or resp.joined or q.kind is not RequestKind.ALLREDUCE:
            return None
        if q.op not in CARRY_OPS or len(q.shapes) != 1:
            return None
        try:
            dt = dtype_of(q.dtype)
        except ValueError:
            return None
        if dt not in CARRY_DTYPES:
            return None
        n = numel(q.shapes[0]) * dt.itemsize
        if n == 0 or n > CARRY_BUDGET or _used(ids_to_bits({cid}), n) > RECORD_BYTES:
            return None
        return _Template(resp, cid, self)

    def allreduce(self, t: Buffer, out: Buffer, name: str, op: int, pre: float, post: float) -> Any:
        """All-reduce ``t`` into ``out`` (validated buffers): ``out`` when done here; a
        Handle to synchronize when the cycle fell back to the general path after
        gathering; None when the call does not qualify (nothing was sent: submit it)."""
        e = self.engine
        if (
            e.timeline is not None
            or not e.gathered.enabled
            or e.settings.cycle_time > 0
            or not e.state.claim_idle()
        ):
            return None
        done = None
        p = None
        try:
            p = self._template(name)
            if (
                p is None
                or t.dtype is not p.dtype
                or t.shape != p.shape
                or op != p.op
                or pre != p.pre
                or post != p.resp.request.postscale
            ):
                return None
            done = self._run(p, t, out)
            return done
        except BaseException as exc:
            raise e.fail(exc) from None
        finally:
            if done is out and p is not None:  # who submitted what: every rank this
                e.state.all_decided(p.bits, p.resp.request.name)
            e.release()

    def _run(self, p: _Template, t: Buffer, out: Buffer) -> Any:
        e = self.engine
        st = e.state
        gathered = e.gathered
        k = st.cycle + 1
        rec = gathered.rec
        rec[: p.hlen] = p.head
        _K.pack_into(gathered.view, 4, k & 0xFFFFFFFF)
        scale(t.array, p.dtype, p.pre, out=p.mine)  # a copy when there is no factor
        counts = e.counts
        counts["cycles"] += 1
        counts["caller"] += 1
        counts["gathered"] += 1
        st.last_sent = time.monotonic()
        gathered.gather(k, e.ranks)
        head = rec[: p.hlen].tobytes()
        for h in p.heads:
            if h.tobytes() != head:
                return self._fall_back(p, t, out, k)
        st.advance(k, True)  # every message was steady and all of it decided
        e.channel.listen = True
        # as carried.reduce: rank order, then the post-scaling (between two buffers)
        parts, bufs, kern = p.parts, p.bufs, p.kernel
        kern(parts[0], parts[1], bufs[0])
        cur = 0
        for v in parts[2:]:
            kern(bufs[cur], v, bufs[1 - cur])
            cur = 1 - cur
        if p.post != 1.0:
            scale(bufs[cur], p.dtype, p.post, out=bufs[1 - cur])
            cur = 1 - cur
        out.array[...] = bufs[cur]
        if e.lead:
            e.observe_holders(p.holders)  # every rank holds it: no stall
        counts["carried"] += 1
        e.cache.put(p.resp)
        st.ended = time.monotonic()
        self.taken += 1
        return out

    def _fall_back(self, p: _Template, t: Buffer, out: Buffer, k: int) -> Handle:
        """The gathered records differ from ours: the general decision, as
        :meth:`HorovodEngine.run_cycle` makes it, with this call pending."""
        e = self.engine
        self.fell_back += 1
        q = p.resp.request
        handle = Handle(q.name, keep=([t], [out]), engine=e)
        entry = Entry(q, [t], [out], handle, _first)
        e.state.add_pending(entry)
        n = p.mine.nbytes
        part = e.gathered.rec[p.hlen : p.hlen + n].tobytes()
        mine: tuple[Any, ...] = ("C", k, p.bits, [], {}, {q.name: part}, True)
        msgs = e.after_gathered(k, *e.gathered.decode_all(k, e.cache, e.ranks))
        msgs[e.me] = mine
        e.decide(k, msgs)
        return handle
