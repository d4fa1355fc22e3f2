"""The TCP store server: one daemon thread, one ``selectors`` loop, every connection.

Defences, in the order a hostile peer meets them:

* connections beyond ``max_connections`` evict the oldest not-yet-authenticated one
  (or are closed at once), so idle strangers cannot lock ranks out;
* a connection must complete its first authenticated frame within ``frame_timeout``
  of accepting, and every later frame within ``frame_timeout`` (plus 1 s per MiB
  announced) of its first byte (slowloris);
* before a connection has authenticated, its first frame may announce at most
  :data:`FIRST_FRAME_MAX` bytes (a client's first request is a bodiless ping) and at
  most that much is read from it: an unauthenticated peer holds a few KiB of the
  server's memory, whatever it announces or sends; afterwards a header announcing
  more than :data:`~.protocol.MAX_FRAME` bytes closes the connection before anything
  is allocated;
* a frame whose MAC fails (wrong secret, replay, another connection's frame) closes
  the connection at once.

Connections dropped before they authenticated (strangers, scanners, other jobs) are
counted (:meth:`TCPStoreServer.num_strangers`), logged one by one at DEBUG only, the
first of them once at INFO: a flood of them writes nothing into the job's output.

Blocking ``get``/``wait`` requests are parked until their keys appear or the
client's timeout passes; nothing polls.
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time

from ..errors import InvalidArgumentError
from ..log import get_logger
from . import protocol as p
from ._kv import KVState, Parked

__all__ = ["FIRST_FRAME_MAX", "TCPStoreServer"]

_log = get_logger("store")
_RECV_CHUNK = 1 << 16
_ACCEPT_BURST = 64
_MIN_RATE = 1 << 20  # bytes/s an authenticated peer is granted for a large frame
FIRST_FRAME_MAX = 1 << 10  # largest body an unauthenticated connection may announce
_FIRST_FRAME_BUF = p.HEADER.size + p.MAC_LEN + FIRST_FRAME_MAX


class _Conn:
    __slots__ = (
        "authed",
        "closing",
        "frame_started",
        "inbuf",
        "nonce",
        "outbuf",
        "parked",
        "peer",
        "rx",
        "sock",
        "tx",
    )

    def __init__(self, sock: socket.socket, peer: str, now: float) -> None:
        self.sock = sock
        self.peer = peer
        self.nonce = secrets.token_bytes(p.NONCE_LEN)
        self.inbuf = bytearray()
        self.outbuf = bytearray(p.HELLO_MAGIC + self.nonce)
        self.rx = 0  # frames received (the next request's counter)
        self.tx = 0  # frames sent (the next response's counter)
        self.authed = False
        self.closing = False
        # when the frame in progress must have started; before authentication: accept time
        self.frame_started: float | None = now
        self.parked: Parked | None = None


class TCPStoreServer:
    """Serve a :class:`~unison.store.TCPStore` from one daemon thread.

    The socket is bound on construction (so :attr:`address` is known at once);
    :meth:`start` begins serving. ``frame_timeout`` bounds how long a frame may take
    to arrive once begun.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        *,
        max_connections: int = 1024,
        frame_timeout: float = 5.0,
        backlog: int = 512,
    ) -> None:
        if not secret:
            raise InvalidArgumentError("TCPStoreServer needs a non-empty job secret")
        if max_connections < 1:
            raise InvalidArgumentError(f"max_connections must be >= 1, got {max_connections}")
        self._secret = bytes(secret)
        self._max = max_connections
        self._frame_timeout = float(frame_timeout)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        self._listener.setblocking(False)
        self._address: tuple[str, int] = self._listener.getsockname()[:2]
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._kv = KVState()
        self._conns: dict[int, _Conn] = {}
        self._accept_paused_until = 0.0
        self._strangers = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- public -----------------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        return self._address

    def start(self) -> TCPStoreServer:
        if self._thread is not None or self._closed:
            raise InvalidArgumentError("TCPStoreServer.start() called twice or after close()")
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(
            target=self._serve, name=f"unison-store-server:{self._address[1]}", daemon=True
        )
        self._thread.start()
        return self

    def get_local(self, key: str) -> bytes | None:
        """The value of ``key`` read in-process (no network), or None if unset."""
        return self._kv.get(key)

    def num_connections(self) -> int:
        return len(self._conns)

    def num_strangers(self) -> int:
        """Connections dropped before they authenticated, since the server started."""
        return self._strangers

    def num_parked(self) -> int:
        """Requests (get/wait) currently waiting for keys."""
        return self._kv.parked_count()

    def close(self) -> None:
        """Stop serving and close the listening socket and every connection."""
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        for conn in list(self._conns.values()):
            self._drop(conn)
        with contextlib.suppress(Exception):
            self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self) -> TCPStoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stopping:
                events = self._sel.select(self._next_timeout())
                for key, mask in events:
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        conn: _Conn = key.data
                        if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and conn.sock.fileno() >= 0:
                            self._read(conn)
                self._housekeeping()
        except Exception:  # pragma: no cover - a bug; keep the process informed
            _log.exception("store server loop failed")

    def _next_timeout(self) -> float | None:
        now = time.monotonic()
        nxt = self._kv.next_deadline()
        for conn in self._conns.values():
            t = self._frame_deadline(conn)
            if t is not None:
                nxt = t if nxt is None else min(nxt, t)
        if self._accept_paused_until:
            t = self._accept_paused_until
            nxt = t if nxt is None else min(nxt, t)
        return None if nxt is None else max(0.0, nxt - now) + 0.001

    def _frame_deadline(self, conn: _Conn) -> float | None:
        """When the frame in progress must be complete (None: between frames)."""
        if conn.frame_started is None:
            return None
        allowed = self._frame_timeout
        if conn.authed and len(conn.inbuf) >= p.HEADER.size:
            # an authenticated peer gets time in proportion to what it announced
            allowed += p.HEADER.unpack_from(conn.inbuf)[0] / _MIN_RATE
        return conn.frame_started + allowed

    def _housekeeping(self) -> None:
        now = time.monotonic()
        self._kv.expire(now)
        self._answer_completed()
        for conn in list(self._conns.values()):
            deadline = self._frame_deadline(conn)
            if deadline is not None and now >= deadline:
                if conn.authed:
                    _log.warning("store: dropping %s: too slow to complete a frame", conn.peer)
                    self._drop(conn)
                else:
                    self._refuse(conn, "too slow to complete its first authenticated frame")
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)

    # -- connections ------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                _log.warning("store: accept failed (%s); pausing accepts for 0.5 s", exc)
                self._sel.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + 0.5
                return
            peer = f"{addr[0]}:{addr[1]}"
            if len(self._conns) >= self._max and not self._evict_one():
                self._strangers += 1
                _log.debug("store: refusing %s: %d connections open", peer, self._max)
                sock.close()
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, peer, time.monotonic())
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._flush(conn)

    def _evict_one(self) -> bool:
        """Drop the oldest unauthenticated connection to make room; False if none."""
        for conn in self._conns.values():  # dicts keep insertion order: oldest first
            if not conn.authed:
                self._refuse(conn, f"evicted: {self._max} connections open")
                return True
        return False

    def _refuse(self, conn: _Conn, why: str, reply: bytes = b"") -> None:
        """Drop a connection that never authenticated: counted, said once at INFO, then
        sent ``reply`` (so a client told it was refused finds the refusal on record)."""
        self._strangers += 1
        if self._strangers == 1:
            _log.info(
                "store: dropped a connection that did not authenticate (%s: %s); "
                "further ones are counted, logged at DEBUG",
                conn.peer,
                why,
            )
        else:
            _log.debug("store: dropped unauthenticated %s: %s", conn.peer, why)
        if reply:
            with contextlib.suppress(OSError):
                conn.sock.send(reply)
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.parked is not None:
            self._kv.cancel(conn.parked)
            conn.parked = None
        fd = conn.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)
        conn.sock.close()

    def _flush(self, conn: _Conn) -> None:
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(conn)
                return
            del conn.outbuf[:sent]
        if conn.closing and not conn.outbuf:
            self._drop(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self._sel.get_key(conn.sock).events != events:
                self._sel.modify(conn.sock, events, conn)

    def _read(self, conn: _Conn) -> None:
        # before authentication, never hold more than one small first frame
        want = _RECV_CHUNK if conn.authed else _FIRST_FRAME_BUF - len(conn.inbuf)
        if want <= 0:  # a whole first frame is buffered and was not taken: cannot happen
            self._refuse(conn, "first frame not understood")
            return
        try:
            data = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            if conn.authed:
                self._drop(conn)
            else:
                self._refuse(conn, "closed before authenticating")
            return
        if conn.closing:
            return
        now = time.monotonic()
        if conn.frame_started is None:
            conn.frame_started = now
        conn.inbuf += data
        consumed = False
        while conn.inbuf and conn.sock.fileno() >= 0:
            if conn.parked is not None:
                _log.warning("store: %s sent a request while one was pending; closing", conn.peer)
                self._drop(conn)
                return
            if len(conn.inbuf) < p.HEADER.size:
                break
            (length,) = p.HEADER.unpack_from(conn.inbuf)
            limit = p.MAX_FRAME if conn.authed else FIRST_FRAME_MAX
            if length > limit:
                if conn.authed:
                    _log.warning(
                        "store: %s announced a %d-byte frame (limit %d); closing",
                        conn.peer,
                        length,
                        limit,
                    )
                    self._drop(conn)
                else:
                    self._refuse(conn, f"its first frame announced {length} bytes")
                return
            end = p.HEADER.size + p.MAC_LEN + length
            if len(conn.inbuf) < end:
                break
            tag = bytes(conn.inbuf[p.HEADER.size : p.HEADER.size + p.MAC_LEN])
            body = bytes(conn.inbuf[p.HEADER.size + p.MAC_LEN : end])
            del conn.inbuf[:end]
            if not p.verify(self._secret, p.C2S, conn.nonce, conn.rx, body, tag):
                if conn.authed:
                    with contextlib.suppress(OSError):
                        conn.sock.send(p.REJECT)
                    _log.warning(
                        "store: frame from %s failed authentication (replay?); closing",
                        conn.peer,
                    )
                    self._drop(conn)
                else:
                    self._refuse(conn, "wrong job secret", reply=p.REJECT)
                return
            conn.rx += 1
            conn.authed = True
            consumed = True
            self._handle(conn, body)
        if conn.sock.fileno() < 0:
            return
        if conn.authed and consumed:
            conn.frame_started = now if conn.inbuf else None

    # -- requests ---------------------------------------------------------------------
    def _respond(self, conn: _Conn, status: p.StoreStatus, fields: list[bytes]) -> None:
        body = p.encode_body(status, fields)
        tag = p.mac(self._secret, p.S2C, conn.nonce, conn.tx, body)
        conn.tx += 1
        conn.outbuf += p.HEADER.pack(len(body)) + tag + body
        self._flush(conn)

    def _handle(self, conn: _Conn, body: bytes) -> None:
        try:
            code, fields = p.decode_body(body)
            try:
                op = p.StoreOp(code)
            except ValueError:
                raise p.ProtocolError(f"unknown op code {code}") from None
            result = self._kv.request(conn, op, fields, time.monotonic())
        except p.ProtocolError as exc:
            result = (p.StoreStatus.ERROR, [f"bad request: {exc}".encode()])
        if isinstance(result, Parked):
            conn.parked = result
        else:
            self._respond(conn, *result)
        self._answer_completed()

    def _answer_completed(self) -> None:
        for waiter, (status, fields) in self._kv.take_completed():
            conn = waiter.owner
            assert isinstance(conn, _Conn)
            conn.parked = None
            if conn.sock.fileno() >= 0:
                self._respond(conn, status, fields)
