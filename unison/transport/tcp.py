"""TCP transport: one authenticated connection per peer pair.

Threads, per peer: a *reader* that always drains the socket (so two ranks that
send to each other at once never deadlock), receiving payloads straight into the
posted buffer (``recv_into`` on a memoryview) or, when no receive is posted yet,
into an unexpected-message copy; and a lazily started *sender* for large or
queued messages. Small messages are sent from the caller's thread when nothing
is queued ahead of them. Frames are written whole under a per-peer lock.

Frames are read whole under a per-peer read lock, by the reader thread or by a
thread waiting for a small message (:meth:`TcpTransport.wait`). For a short window
the waiting thread reads its peer's socket itself, and the reader thread rests
meanwhile (the connection's *lease*): a message that arrives then wakes one thread,
not the reader and then the waiter it hands the message to, which in Python costs
more than the exchange itself. A wait that outlasts the window, or for a large
message (which the reader receives while the caller computes), ends the lease and
sleeps until the reader delivers.

A peer whose connection drops fails every receive posted for it at once with
:class:`PeerLostError`, and the communicator is told so it can fail in-flight
collectives promptly instead of waiting for their deadline.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from .._types import OpSig
from ..errors import PeerLostError
from ..log import get_logger
from .base import Events, Key, MatchingTransport, PeerInfo
from .framing import HEADER, Control, FrameError, FrameKind, pack, unpack
from .matching import Matcher, Unexpected
from .request import Request

__all__ = ["TcpTransport"]

log = get_logger("tcp")
_POLL = 1.0  # bounded poll of socket operations, so threads notice shutdown
_MAX_CONTROL = 1 << 20
#: longest a thread waiting for a small message reads its peer's socket itself before it
#: leaves the socket to the reader thread and sleeps until delivery: long enough for a
#: peer that is running the same collective to answer, short enough that a wait for a
#: late peer is the reader's (whose delivery also wakes a waiter that a failure ends)
_LANE_S = 0.005


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A writable byte memoryview of a contiguous array (no copy)."""
    return memoryview(arr).cast("B")  # type: ignore[arg-type]


def _sig_matches(a: OpSig, b: OpSig) -> bool:
    return a == b


#: what a socket reports once its peer closed or reset the connection (POLLRDHUP: the peer
#: shut down its sending side, Linux only)
_HANGUP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
#: longest a rank waits for its reader thread to take an end of stream the kernel already
#: holds (the reader takes it as soon as it runs: only a stalled thread takes this long)
_VERDICT_S = 1.0


def _hung_up(sock: socket.socket) -> bool:
    """Whether the kernel already knows that ``sock``'s peer closed or reset the
    connection (bytes may still be unread before it). Nothing is read."""
    poller = select.poll()
    try:
        poller.register(sock, _HANGUP)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed under us: the reader will say why
        return False


class _Conn:
    """State of one peer connection."""

    def __init__(self, peer: int, sock: socket.socket) -> None:
        self.peer = peer
        self.sock = sock
        self.send_lock = threading.Lock()
        #: held while a thread reads one whole frame (the reader, or a waiting caller)
        self.read_lock = threading.Lock()
        #: readiness of ``sock`` for a caller holding ``read_lock`` (the reader has its own)
        self.lane_poll = select.poll()
        self.lane_poll.register(sock, select.POLLIN)
        #: until when (monotonic) callers read this socket themselves (:meth:`wait`):
        #: the reader thread rests until then instead of waking for every frame
        self.lease_until = 0.0
        self.rest = threading.Condition(threading.Lock())  # where the reader rests
        self.queue: deque[tuple[Request, bytes, float]] = deque()
        self.cv = threading.Condition(threading.Lock())
        self.sender: threading.Thread | None = None
        self.reader: threading.Thread | None = None
        self.dead: str | None = None
        self.goodbye = False


class TcpTransport(MatchingTransport):
    name = "tcp"

    def __init__(self, rank: int, events: Events, inline_bytes: int = 1 << 16) -> None:
        self.rank = rank
        self.events = events
        self.inline_bytes = inline_bytes
        self.matcher = Matcher()
        self.conns: dict[int, _Conn] = {}
        self._closing = False
        #: rewrites each outgoing header (fault injection in tests); None normally
        self.send_hook: Callable[[int, bytes], bytes] | None = None

    # --- connection management (bootstrap hands us authenticated sockets) ----------
    def can_connect(self, me: PeerInfo, peer: PeerInfo) -> bool:
        return True

    def attach(self, peer: int, sock: socket.socket) -> None:
        """Adopt an authenticated socket to ``peer`` and start its reader."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(_POLL)
        conn = _Conn(peer, sock)
        self.conns[peer] = conn
        conn.reader = threading.Thread(
            target=self._read_loop, args=(conn,), name=f"unison-tcp-read-{peer}", daemon=True
        )
        conn.reader.start()

    # --- sending -------------------------------------------------------------------
    def isend(self, peer: int, key: Key, view: np.ndarray, sig: OpSig, deadline: float) -> Request:
        req = Request(peer, key, view, sig)
        conn = self.conns[peer]
        if conn.dead is not None:
            req.complete(self._lost_error(conn))
            return req
        hdr = pack(key[0], key[1], key[2], key[3], sig, req.nbytes)
        if req.nbytes <= self.inline_bytes and conn.send_lock.acquire(blocking=False):
            try:
                if not conn.queue:
                    self._send_or_fail(conn, req, hdr, deadline)
                    return req
            finally:
                conn.send_lock.release()
        with conn.cv:
            conn.queue.append((req, hdr, deadline))
            if conn.sender is None:
                conn.sender = threading.Thread(
                    target=self._send_loop,
                    args=(conn,),
                    name=f"unison-tcp-send-{peer}",
                    daemon=True,
                )
                conn.sender.start()
            conn.cv.notify()
        return req

    def _send_or_fail(self, conn: _Conn, req: Request, hdr: bytes, deadline: float) -> None:
        try:
            self._write(conn, hdr, req.view, deadline)
        except OSError as exc:
            self._peer_lost(conn, f"send failed: {exc}")
            req.complete(self._lost_error(conn))
        else:
            req.complete()

    def _write(self, conn: _Conn, hdr: bytes, view: np.ndarray | None, deadline: float) -> None:
        """Write one frame; the caller holds ``conn.send_lock``."""
        if self.send_hook is not None:
            hdr = self.send_hook(conn.peer, hdr)
        parts: list[memoryview] = [memoryview(hdr)]
        if view is not None and view.nbytes:
            parts.append(_bytes_view(view))
        while parts:
            try:
                sent = conn.sock.sendmsg(parts)
            except TimeoutError:
                if time.monotonic() > deadline or self._closing or conn.dead:
                    raise OSError("peer stopped reading before the deadline") from None
                continue
            while sent and parts:
                n = len(parts[0])
                if sent >= n:
                    sent -= n
                    parts.pop(0)
                else:
                    parts[0] = parts[0][sent:]
                    sent = 0

    def _send_loop(self, conn: _Conn) -> None:
        while True:
            with conn.cv:
                while not conn.queue:
                    if self._closing or conn.dead is not None:
                        return
                    conn.cv.wait(_POLL)
            with conn.send_lock:
                with conn.cv:
                    if not conn.queue:
                        continue
                    req, hdr, deadline = conn.queue.popleft()
                if conn.dead is not None:
                    req.complete(self._lost_error(conn))
                    continue
                self._send_or_fail(conn, req, hdr, deadline)

    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        conn = self.conns.get(peer)
        if conn is None or conn.dead is not None:
            return
        hdr = pack(FrameKind.CONTROL, 0, 0, ctl, OpSig(), len(payload))
        view = np.frombuffer(payload, np.uint8) if payload else None
        if conn.send_lock.acquire(timeout=2.0):
            try:
                self._write(conn, hdr, view, time.monotonic() + 2.0)
            except OSError:
                pass
            finally:
                conn.send_lock.release()

    # --- receiving -----------------------------------------------------------------
    def irecv(self, peer: int, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        req = Request(peer, key, view, sig)
        conn = self.conns[peer]
        msg = self.matcher.post(req)
        if msg is not None:
            self.deliver_copy(req, msg)
        elif conn.dead is not None:
            self.matcher.cancel(req)
            req.complete(self._lost_error(conn))
        return req

    def wait(self, req: Request, timeout: float) -> bool:
        """Wait for ``req`` at most ``timeout`` seconds, as :meth:`Request.wait` does.

        For a small message the caller first reads its peer's socket itself for a short
        window (:data:`_LANE_S`), delivering whatever frames come (its own, or any
        other's), so its message needs no hand-over from the reader thread, which rests
        meanwhile. A wait that outlasts the window, or for a large message, wakes the
        reader and sleeps until it delivers."""
        conn = self.conns.get(req.peer)
        if conn is None or req.done():
            return req.wait(timeout)
        if req.nbytes > self.inline_bytes:
            self._wake_reader(conn)
            return req.wait(timeout)
        start = time.monotonic()
        window = min(timeout, _LANE_S)
        conn.lease_until = start + _LANE_S
        if conn.read_lock.acquire(timeout=window):  # the reader may be mid-frame
            try:
                self._read_until(conn, req, start + window)
            finally:
                conn.read_lock.release()
        if not req.done():
            self._wake_reader(conn)
        return req.wait(max(0.0, start + timeout - time.monotonic()))

    def wake_readers(self) -> None:
        """Have every reader thread read now (a wait that no caller's reading serves:
        a receive from any peer)."""
        for conn in list(self.conns.values()):
            self._wake_reader(conn)

    @staticmethod
    def _wake_reader(conn: _Conn) -> None:
        """End ``conn``'s lease: its reader thread reads again from now on."""
        if conn.lease_until:
            with conn.rest:
                conn.lease_until = 0.0
                conn.rest.notify_all()

    def _read_until(self, conn: _Conn, req: Request, end: float) -> None:
        """Read ``conn``'s frames until ``req`` completes or ``end`` passes; the caller
        holds ``conn.read_lock``."""
        while not req.done() and conn.dead is None and not self._closing:
            left = end - time.monotonic()
            if left <= 0 or not conn.lane_poll.poll(left * 1000.0):
                return
            reason = self._read_one(conn)
            if reason is not None:
                self._peer_lost(conn, reason)
                return

    def _read_one(self, conn: _Conn) -> str | None:
        """Read and deliver one frame; None, or why the connection is over."""
        try:
            if self._read_frame(conn):
                return None
            return "connection closed"
        except FrameError as exc:
            return f"protocol error: {exc}"
        except OSError as exc:
            return f"connection error: {exc}"

    def _recv_into(self, conn: _Conn, mv: memoryview) -> bool:
        """Fill ``mv`` from the socket; False on orderly EOF."""
        got, n = 0, len(mv)
        while got < n:
            try:
                k = conn.sock.recv_into(mv[got:], n - got)
            except TimeoutError:
                if self._closing:
                    return False
                continue
            if k == 0:
                return False
            got += k
        return True

    def _discard(self, conn: _Conn, length: int) -> bool:
        scratch = memoryview(bytearray(min(length, 1 << 20)))
        while length:
            step = min(length, len(scratch))
            if not self._recv_into(conn, scratch[:step]):
                return False
            length -= step
        return True

    def _read_loop(self, conn: _Conn) -> None:
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        reason: str | None = None
        while reason is None and conn.dead is None and not self._closing:
            with conn.rest:  # rest while callers read this socket themselves (wait)
                rest = conn.lease_until - time.monotonic()
                if rest > 0:
                    conn.rest.wait(rest)
                    continue
            try:
                if not poller.poll(_POLL * 1000.0):
                    continue
            except OSError as exc:  # closed under us
                reason = f"connection error: {exc}"
                break
            with conn.read_lock:
                # a waiting caller may have read what woke us (or lost the connection)
                if conn.dead is None and not self._closing and poller.poll(0):
                    reason = self._read_one(conn)
        self._peer_lost(conn, reason or "connection closed")

    def _read_frame(self, conn: _Conn) -> bool:
        """Read one whole frame and deliver it; False on end of stream. The caller holds
        ``conn.read_lock``."""
        hdr = bytearray(HEADER.size)
        if not self._recv_into(conn, memoryview(hdr)):
            return False
        frame = unpack(hdr)
        if frame.kind is FrameKind.CONTROL:
            return self._control(conn, frame.tag, frame.length)
        key = frame.key
        req = self.matcher.take_posted(conn.peer, key)
        if req is None:
            data = bytearray(frame.length)
            if frame.length and not self._recv_into(conn, memoryview(data)):
                return False
            req = self.matcher.add_unexpected(conn.peer, key, Unexpected(data, frame.sig))
            if req is not None:
                self.deliver_copy(req, Unexpected(data, frame.sig))
            elif frame.kind is FrameKind.COLL:
                self.events.unexpected(conn.peer, key, frame.sig)
            return True
        if frame.length != req.nbytes or not _sig_matches(req.sig, frame.sig):
            err = self._mismatch(req, frame.sig, frame.length)
            if not self._discard(conn, frame.length):
                return False
            req.complete(err)
            return True
        if req.nbytes and req.view is not None:
            if not self._recv_into(conn, _bytes_view(req.view)):
                req.complete(self._lost_error(conn, "closed mid-message"))
                return False
        req.complete()
        return True

    def _control(self, conn: _Conn, ctl: int, length: int) -> bool:
        if length > _MAX_CONTROL:
            raise FrameError(f"control frame of {length} bytes")
        data = bytearray(length)
        if length and not self._recv_into(conn, memoryview(data)):
            return False
        if ctl == Control.GOODBYE:
            conn.goodbye = True
        elif ctl == Control.ABORT:
            try:
                info = json.loads(data.decode())
            except ValueError:
                info = {"message": "undecodable abort"}
            self.events.abort(conn.peer, info)
        return True

    # --- failure and shutdown -------------------------------------------------------
    def gone(self, peers: Sequence[int]) -> PeerLostError | None:
        """Why one of ``peers`` can no longer take part (its connection closed), or None;
        a peer that shut down in order is explained first (:meth:`explain`)."""
        for p in peers:
            conn = self.conns.get(p)
            if conn is not None and conn.dead is not None:
                return self.explain(self._lost_error(conn), peers)
        return None

    def explain(self, err: PeerLostError, peers: Sequence[int]) -> PeerLostError:
        """``err``, or when it says that a peer shut down in order, the loss of one of
        ``peers`` that explains it (this rank may be among them: it has no connection).

        A peer that shuts down in order in the middle of an operation has mostly failed
        on a peer that was lost, and left: the lost peer is the one to name. Its end of
        stream may already sit in the kernel while this rank's reader thread has not taken
        it yet (a loaded host): for a connection whose peer has hung up, the reader's
        verdict (a goodbye before the end, or none) is awaited."""
        conn = self.conns.get(err.ranks[0]) if len(err.ranks) == 1 else None
        if conn is None or not conn.goodbye:
            return err
        for p in peers:
            other = self.conns.get(p)
            if other is None:
                continue
            if other.dead is None and _hung_up(other.sock):
                self._await_verdict(other)
            if other.dead is not None and not other.goodbye:
                return self._lost_error(other)
        return err

    def _await_verdict(self, conn: _Conn) -> None:
        """Wait (at most :data:`_VERDICT_S`) until ``conn``'s reader has taken its end of
        stream: :meth:`_peer_lost` sets ``dead``, then notifies ``conn.cv``."""
        self._wake_reader(conn)  # it may rest while callers read (wait)
        with conn.cv:
            conn.cv.wait_for(lambda: conn.dead is not None, _VERDICT_S)

    def _lost_error(self, conn: _Conn, detail: str | None = None) -> PeerLostError:
        if conn.goodbye:
            msg = f"rank {conn.peer} has shut down"
        else:
            msg = f"lost connection to rank {conn.peer} ({detail or conn.dead or 'closed'})"
        return PeerLostError(msg, ranks=(conn.peer,))

    def _peer_lost(self, conn: _Conn, reason: str) -> None:
        if conn.dead is not None:
            return
        conn.dead = reason
        graceful = conn.goodbye or self._closing
        if not graceful:
            log.info("lost connection to rank %d (%s)", conn.peer, reason)
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        err = self._lost_error(conn)
        for req in self.matcher.drop_peer(conn.peer):
            req.complete(err)
        with conn.cv:
            pending = list(conn.queue)
            conn.queue.clear()
            conn.cv.notify_all()
        self._wake_reader(conn)
        for req, _, _ in pending:
            req.complete(err)
        if not self._closing:
            self.events.peer_lost(conn.peer, reason, conn.goodbye)

    def close(self) -> None:
        for conn in self.conns.values():
            self.send_control(conn.peer, Control.GOODBYE, b"")
        self._closing = True
        for conn in self.conns.values():
            with conn.cv:
                conn.cv.notify_all()
            self._peer_lost(conn, "closed")
            self._wake_reader(conn)
        for conn in self.conns.values():
            for t in (conn.reader, conn.sender):
                if t is not None and t is not threading.current_thread():
                    t.join(timeout=2.0)
            conn.sock.close()
        self.conns.clear()
