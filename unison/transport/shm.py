"""Shared-memory transport: rings in /dev/shm between ranks of one host.

Each directed pair has a single-producer/single-consumer byte ring in the
*receiver's* segment (:mod:`.shm_segment`, :mod:`.shm_ring`). A send copies its
frame (the 48-byte unison header and the payload) into the ring; a receive
copies it out into the posted buffer, or into an unexpected-message copy when
nothing is posted yet — the same matching (:class:`Matcher`), ordering per key,
mismatch and peer-loss semantics as TCP. A message larger than the ring streams
through it in pieces; per-rank shared memory stays fixed.

Progress is made by whoever waits: a thread blocked in :meth:`Request.wait`
first *spins* on the rings (a peer that is already waiting answers in about a
microsecond), then *yields* the core (``sched_yield``: when ranks outnumber
cores the peer we wait for gets to run), then *blocks* while a background
thread sleeps on this rank's doorbell futex. Peers bump the doorbell after
writing or consuming and make the wake-up syscall only when the sleeping flag is
up, so a rank that is spinning costs its peers nothing extra. The background
thread also moves queued data when nobody waits (isend progress, like TCP).

Control frames (abort, goodbye) and liveness stay on the TCP connection: a dead
rank is noticed by its socket closing, and :meth:`ShmTransport.peer_gone` then
drains what the peer wrote before failing what is still posted.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from .._types import OpSig
from ..errors import PeerLostError
from ..jobenv import host_cores
from ..log import get_logger
from . import futex
from .base import Events, Key, MatchingTransport, PeerInfo
from .framing import HEADER, FrameError, FrameKind, pack, unpack
from .matching import Matcher, Unexpected
from .request import Request
from .shm_ring import Ring
from .shm_segment import Segment
from .wait_policy import WaitPolicy

__all__ = ["ShmRequest", "ShmTransport"]

log = get_logger("shm")
_HDR = HEADER.size
_SMALL = 4096  # frames up to this size go into the ring with one copy, whole
_IDLE_S = 0.05  # the sleeping progress thread re-checks this often (lost-wake bound)
_ENTER_S = 0.002  # idle this long before the progress thread takes the doorbell


class ShmRequest(Request):
    """A request whose ``wait`` drives the transport's progress (spin, yield, block)."""

    __slots__ = ("_tx",)

    def __init__(
        self, tx: ShmTransport, peer: int, key: Key, view: np.ndarray | None, sig: OpSig
    ) -> None:
        super().__init__(peer, key, view, sig)
        self._tx = tx

    def wait(self, timeout: float | None) -> bool:
        if not self._done and not self._tx.wait_for(self, timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def wait_event(self, timeout: float) -> bool:
        return self.wait_done(timeout)


class _Out:
    """Sending side of one pair: the ring in the peer's segment, and a queue."""

    def __init__(self, peer: int, ring: Ring, seg: Segment) -> None:
        self.peer = peer
        self.ring = ring
        self.seg = seg
        self.queue: deque[list[object]] = deque()  # [req, header, payload, sent]
        self.dead: str | None = None


class _In:
    """Receiving side of one pair: the ring in this rank's segment, and parse state."""

    def __init__(self, peer: int, ring: Ring, peer_seg: Segment) -> None:
        self.peer = peer
        self.ring = ring
        self.peer_seg = peer_seg
        self.dead: str | None = None
        self.goodbye = False
        self.length = -1  # payload bytes of the frame being received; -1: expecting a header
        self.got = 0
        self.dest: memoryview | None = None
        self.req: Request | None = None
        self.err: BaseException | None = None
        self.data: bytearray | None = None
        self.key: Key = (0, 0, 0, 0)
        self.sig = OpSig()
        self.kind = 0


def _mv(arr: np.ndarray) -> memoryview:
    """A byte memoryview of a contiguous uint8 array (no copy)."""
    return memoryview(arr).cast("B")  # type: ignore[arg-type]


def _ring_bell(seg: Segment) -> None:
    seg.bell.value = (seg.bell.value + 1) & 0xFFFFFFFF
    if seg.sleeping.value:
        futex.wake(seg.bell_addr)


class ShmTransport(MatchingTransport):
    name = "shm"

    def __init__(
        self,
        rank: int,
        events: Events,
        seg: Segment,
        local_size: int,
        control: Callable[[int, int, bytes], None],
    ) -> None:
        self.rank = rank
        self.events = events
        self.seg = seg
        self._control = control
        self.matcher = Matcher()
        self.outs: dict[int, _Out] = {}
        self.ins: dict[int, _In] = {}
        self._in_list: list[_In] = []
        self._busy: list[_Out] = []  # outs with queued data
        self._lock = threading.Lock()
        self._deferred: list[tuple[int, Key, OpSig]] = []
        self._deferred_lost: list[tuple[int, str]] = []
        self._cv = threading.Condition()
        self._spinners = 0
        self._kick = False
        self._last_active = time.monotonic()
        self._closing = False
        self.wait_policy = WaitPolicy(oversubscribed=local_size > host_cores())
        self._thread: threading.Thread | None = None
        #: rewrites each outgoing header (fault injection in tests); None normally
        self.send_hook: Callable[[int, bytes], bytes] | None = None

    # --- set-up (the fabric negotiates and hands us the mapped rings) -------------------
    def can_connect(self, me: PeerInfo, peer: PeerInfo) -> bool:
        return me.host_id == peer.host_id

    def add_peer(self, peer: int, inbound: Ring, outbound: Ring, peer_seg: Segment) -> None:
        self.outs[peer] = _Out(peer, outbound, peer_seg)
        ib = _In(peer, inbound, peer_seg)
        self.ins[peer] = ib
        self._in_list.append(ib)

    def start(self) -> None:
        if self._thread is None and self.ins:
            self._thread = threading.Thread(
                target=self._background, name="unison-shm-progress", daemon=True
            )
            self._thread.start()

    # --- sending --------------------------------------------------------------------------
    def isend(self, peer: int, key: Key, view: np.ndarray, sig: OpSig, deadline: float) -> Request:
        req = ShmRequest(self, peer, key, view, sig)
        out = self.outs[peer]
        if out.dead is not None:
            req.complete(self._lost(peer))
            return req
        hdr = pack(key[0], key[1], key[2], key[3], sig, req.nbytes)
        if self.send_hook is not None:
            hdr = self.send_hook(peer, hdr)
        n = req.nbytes
        with self._lock:
            if not out.queue:
                ring = out.ring
                if n + _HDR <= _SMALL and ring.free() >= n + _HDR:
                    frame = memoryview(hdr + view.tobytes()) if n else memoryview(hdr)
                    ring.put(frame, 0, n + _HDR)
                    ring.publish()
                    _ring_bell(out.seg)
                    req.complete()
                    return req
            out.queue.append([req, memoryview(hdr), _mv(view), 0])
            if len(out.queue) == 1:
                self._busy.append(out)
                self._push(out)
            queued = bool(out.queue)
        if queued and not self._spinners:
            self._wake_background()  # nobody may wait: keep the data moving
        return req

    def _push(self, out: _Out) -> bool:
        """Move queued frames of ``out`` into its ring; the lock is held."""
        ring = out.ring
        moved = False
        while out.queue:
            entry = out.queue[0]
            req, hdr, payload, sent = entry
            assert isinstance(req, Request) and isinstance(sent, int)
            assert isinstance(hdr, memoryview) and isinstance(payload, memoryview)
            total = _HDR + req.nbytes
            while sent < total:
                if sent < _HDR:
                    k = ring.put(hdr, sent, _HDR - sent)
                else:
                    k = ring.put(payload, sent - _HDR, total - sent)
                if k == 0:
                    break
                sent += k
                moved = True
            entry[3] = sent
            if sent < total:
                break
            out.queue.popleft()
            req.complete()
        if moved:
            ring.publish()
            _ring_bell(out.seg)
        if not out.queue and out in self._busy:
            self._busy.remove(out)
        return moved

    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        self._control(peer, ctl, payload)

    # --- receiving ----------------------------------------------------------------------------
    def irecv(self, peer: int, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        req = ShmRequest(self, peer, key, view, sig)
        msg = self.matcher.post(req)
        if msg is not None:
            self.deliver_copy(req, msg)
        elif self.ins[peer].dead is not None:
            self._progress_now()
            if not req.done():
                self.matcher.cancel(req)
                req.complete(self._lost(peer))
        return req

    def _drain(self, ib: _In) -> bool:
        """Consume what ``ib``'s ring holds; the lock is held. True if anything moved."""
        ring = ib.ring
        moved = False
        while True:
            avail = ring.available()
            if ib.length < 0:
                if avail < _HDR:
                    break
                frame = unpack(ring.peek(_HDR))
                ring.get(None, 0, _HDR)
                avail -= _HDR
                moved = True
                self._begin(ib, frame.key, frame.sig, frame.length, int(frame.kind))
            k = min(avail, ib.length - ib.got)
            if k > 0:
                ring.get(ib.dest, ib.got, k)
                ib.got += k
                moved = True
            if ib.got < ib.length:
                break
            self._end(ib)
        if moved:
            ring.release()
            _ring_bell(ib.peer_seg)
        return moved

    def _begin(self, ib: _In, key: Key, sig: OpSig, length: int, kind: int) -> None:
        ib.length, ib.got, ib.key, ib.sig, ib.kind = length, 0, key, sig, kind
        ib.err, ib.data, ib.dest = None, None, None
        req = self.matcher.take_posted(ib.peer, key)
        ib.req = req
        if req is None:
            ib.data = bytearray(length)
            ib.dest = memoryview(ib.data)
        elif length != req.nbytes or req.sig != sig:
            ib.err = self._mismatch(req, sig, length)
        elif length and req.view is not None:
            ib.dest = _mv(req.view)

    def _end(self, ib: _In) -> None:
        req, data = ib.req, ib.data
        ib.length, ib.req, ib.dest, ib.data = -1, None, None, None
        if req is not None:
            req.complete(ib.err)
            return
        assert data is not None
        msg = Unexpected(data, ib.sig)
        late = self.matcher.add_unexpected(ib.peer, ib.key, msg)
        if late is not None:
            self.deliver_copy(late, msg)
        elif ib.kind == FrameKind.COLL:
            self._deferred.append((ib.peer, ib.key, ib.sig))

    # --- progress -------------------------------------------------------------------------------
    def _progress(self) -> bool:
        """One pass over every queue and ring; the lock is held."""
        moved = False
        for out in list(self._busy):
            if out.dead is None and self._push(out):
                moved = True
        for ib in self._in_list:
            if ib.dead is None and ib.ring.available() and self._safe_drain(ib):
                moved = True
        return moved

    def _safe_drain(self, ib: _In) -> bool:
        try:
            return self._drain(ib)
        except FrameError as exc:
            self._fail_peer(ib.peer, f"protocol error on the shared-memory ring: {exc}")
            self._deferred_lost.append((ib.peer, str(exc)))
            return True

    def _progress_now(self, blocking: bool = True) -> bool:
        if not self._lock.acquire(blocking):
            return False
        try:
            moved = self._progress()
            deferred, self._deferred = self._deferred, []
            lost, self._deferred_lost = self._deferred_lost, []
        finally:
            self._lock.release()
        for peer, key, sig in deferred:
            self.events.unexpected(peer, key, sig)
        for peer, reason in lost:
            self.events.peer_lost(peer, reason, False)
        return moved

    def wait_for(self, req: ShmRequest, timeout: float | None) -> bool:
        """Spin, then yield, then block until ``req`` is done; False on timeout."""
        policy = self.wait_policy
        start = now = time.monotonic()
        deadline = now + (timeout if timeout is not None else 1e9)
        spin_s, yield_s = policy.spin_s, policy.yield_s
        spin_end = now + spin_s
        yield_end = spin_end + yield_s
        with self._cv:
            self._spinners += 1
        spinning = True
        try:
            ins = self._in_list
            while not req.done():
                # take the lock only when a queue or a ring has something to move
                work = bool(self._busy)
                if not work:
                    for ib in ins:
                        if ib.ring.available():
                            work = True
                            break
                moved = self._progress_now(blocking=False) if work else False
                if req.done():
                    break
                now = time.monotonic()
                if now >= deadline:
                    return False
                if moved:
                    spin_end = now + spin_s
                    yield_end = spin_end + yield_s
                elif now < spin_end:
                    continue
                elif now < yield_end:
                    os.sched_yield()
                else:
                    if spinning:  # hand the doorbell to the progress thread, then sleep
                        spinning = False
                        with self._cv:
                            self._spinners -= 1
                            self._kick = True
                            self._cv.notify_all()
                    req.wait_event(deadline - now)
        finally:
            end = time.monotonic()
            with self._cv:
                if spinning:
                    self._spinners -= 1
                self._last_active = end
        policy.observe(end - start, blocked=not spinning)
        return True

    def _background(self) -> None:
        """Progress while nobody waits: sleep on the doorbell once the rank has been idle.

        While threads spin in :meth:`wait_for` (or did so within the last
        ``_ENTER_S``), this thread stays parked and the sleeping flag stays down,
        so peers never pay a wake-up syscall for a rank that is busy anyway.
        """
        seg = self.seg
        while not self._closing:
            with self._cv:
                while not self._closing and not self._kick:
                    idle = time.monotonic() - self._last_active
                    if not self._spinners and idle >= _ENTER_S:
                        break
                    self._cv.wait(_ENTER_S)
                self._kick = False
            if self._closing:
                break
            seq = seg.bell.value
            seg.sleeping.value = 1
            if not self._progress_now() and not self._spinners and not self._closing:
                futex.wait(seg.bell_addr, seq, _IDLE_S)
            seg.sleeping.value = 0
            self._progress_now()

    def _wake_background(self) -> None:
        with self._cv:
            self._kick = True
            self._cv.notify_all()

    # --- failure and shutdown ---------------------------------------------------------------
    def _lost(self, peer: int) -> PeerLostError:
        ib = self.ins.get(peer)
        if ib is not None and ib.goodbye:
            return PeerLostError(f"rank {peer} has shut down", ranks=(peer,))
        reason = (ib.dead if ib is not None else None) or "closed"
        return PeerLostError(f"lost connection to rank {peer} ({reason})", ranks=(peer,))

    def _fail_peer(self, peer: int, reason: str) -> None:
        """Mark ``peer`` gone and fail everything pending with it; the lock is held."""
        ib, out = self.ins[peer], self.outs[peer]
        if ib.dead is not None:
            return
        ib.dead = out.dead = reason
        err = self._lost(peer)
        if ib.req is not None:
            ib.req.complete(err)
        ib.length, ib.req, ib.dest, ib.data = -1, None, None, None
        for req in self.matcher.drop_peer(peer):
            req.complete(err)
        while out.queue:
            pending = out.queue.popleft()[0]
            assert isinstance(pending, Request)
            pending.complete(err)
        if out in self._busy:
            self._busy.remove(out)

    def peer_gone(self, peer: int, reason: str, graceful: bool) -> None:
        """The peer's TCP connection closed: take what it wrote, fail what remains."""
        if peer not in self.ins:
            return
        with self._lock:
            ib = self.ins[peer]
            ib.goodbye = graceful
            if ib.dead is None:
                self._safe_drain(ib)
            self._fail_peer(peer, reason)

    def close(self) -> None:
        # give queued sends a moment to reach their rings (the peer may be draining)
        limit = time.monotonic() + 1.0
        while self._busy and time.monotonic() < limit:
            if not self._progress_now():
                futex.wait(self.seg.bell_addr, self.seg.bell.value, 0.005)
        self._closing = True
        with self._cv:
            self._cv.notify_all()
        futex.wake(self.seg.bell_addr, 8)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            for peer in list(self.ins):
                self._fail_peer(peer, "closed")
        self.seg.unlink()
