"""The TCP store client: one authenticated connection, one request at a time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Sequence

from ..errors import AuthenticationError, InvalidArgumentError, StoreError, StoreTimeoutError
from . import protocol as p
from .base import Store, missing_keys_error

__all__ = ["TCPStore"]

# Extra seconds a client waits for the answer to a parked get/wait beyond its own
# deadline (the server answers at the deadline; this only covers the network).
_ANSWER_GRACE = 10.0


class TCPStore(Store):
    """Client of a :class:`~unison.store.TCPStoreServer`.

    Connects (retrying until ``timeout`` while the server is not up yet), proves
    knowledge of ``secret`` with a ping and raises
    :class:`~unison.errors.AuthenticationError` if the server rejects it; with
    ``verify=False`` the first request proves it instead (one round trip less: the
    error then comes from that request). Thread-safe:
    requests from several threads are serialised, so a long ``get`` delays the others.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | None = None,
        timeout: float = 300.0,
        *,
        connect_timeout: float | None = None,
        verify: bool = True,
    ) -> None:
        if not secret:
            raise InvalidArgumentError("TCPStore needs a non-empty job secret")
        self._secret = bytes(secret)
        self.timeout = self._timeout(timeout)
        self._where = f"store at {host}:{port}"
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._tx = 0
        self._rx = 0
        wait = self.timeout if connect_timeout is None else connect_timeout
        self._sock = self._connect(host, port, wait)
        try:
            self._nonce = self._handshake(min(wait, 30.0) if wait > 0 else 30.0)
            if verify:
                self._request(p.StoreOp.PING, [])
        except BaseException:
            self._sock.close()
            raise

    # -- connection -------------------------------------------------------------------
    def _connect(self, host: str, port: int, wait: float) -> socket.socket:
        deadline = time.monotonic() + wait
        delay = 0.01
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((host, port), timeout=max(left, 1.0))
            except OSError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeoutError(
                        f"could not connect to {self._where} within {wait:g} s: {exc}"
                    ) from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def _handshake(self, wait: float) -> bytes:
        self._sock.settimeout(wait)
        try:
            hello = self._recv_exact(p.HELLO)
        except (OSError, StoreError) as exc:
            raise StoreError(f"{self._where} sent no greeting: {exc}") from None
        if hello[: len(p.HELLO_MAGIC)] != p.HELLO_MAGIC:
            raise StoreError(f"{self._where} is not a unison store (bad greeting)")
        return hello[len(p.HELLO_MAGIC) :]

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise StoreError(f"{self._where} closed the connection")
            got += k
        return bytes(buf)

    def _request(
        self, op: p.StoreOp, fields: list[bytes], *, wait: float = 0.0
    ) -> tuple[p.StoreStatus, list[bytes]]:
        try:
            body = p.encode_body(op, fields)
        except p.ProtocolError as exc:
            raise InvalidArgumentError(f"{op.name} request too large: {exc}") from None
        with self._lock:
            if self._broken is not None:
                raise StoreError(f"connection to {self._where} is unusable: {self._broken}")
            frame = (
                p.HEADER.pack(len(body))
                + p.mac(self._secret, p.C2S, self._nonce, self._tx, body)
                + body
            )
            first = self._tx == 0  # the server checks our secret on this one
            self._tx += 1
            try:
                self._sock.settimeout(max(self.timeout, 1.0) + wait + _ANSWER_GRACE)
                self._sock.sendall(frame)
                return self._read_response(first)
            except TimeoutError:
                self._broken = "timed out waiting for an answer"
                raise StoreTimeoutError(f"{self._where} did not answer {op.name}") from None
            except (StoreError, AuthenticationError) as exc:
                self._broken = str(exc)
                raise
            except OSError as exc:
                self._broken = str(exc)
                raise StoreError(f"lost connection to {self._where}: {exc}") from None

    def _read_response(self, first: bool) -> tuple[p.StoreStatus, list[bytes]]:
        try:
            head = self._recv_exact(p.HEADER.size)
        except StoreError:
            if first:
                raise StoreError(
                    f"{self._where} closed the connection during the handshake "
                    "(server full, or not a unison store)"
                ) from None
            raise
        if head == p.REJECT:
            raise AuthenticationError(f"{self._where} rejected our job secret")
        (length,) = p.HEADER.unpack(head)
        if length > p.MAX_FRAME:
            raise StoreError(f"{self._where} announced an oversized {length}-byte answer")
        rest = self._recv_exact(p.MAC_LEN + length)
        tag, body = rest[: p.MAC_LEN], rest[p.MAC_LEN :]
        if not p.verify(self._secret, p.S2C, self._nonce, self._rx, body, tag):
            raise AuthenticationError(
                f"answer from {self._where} failed authentication (is it another job's store?)"
            )
        self._rx += 1
        try:
            code, fields = p.decode_body(body)
            return p.StoreStatus(code), fields
        except (p.ProtocolError, ValueError) as exc:
            raise StoreError(f"malformed answer from {self._where}: {exc}") from None

    def _ok(self, status: p.StoreStatus, fields: list[bytes], timeout: float = 0.0) -> list[bytes]:
        if status is p.StoreStatus.OK:
            return fields
        if status is p.StoreStatus.TIMEOUT:
            keys = [f.decode("utf-8", "replace") for f in fields]
            raise missing_keys_error(self._where, keys, timeout)
        raise StoreError(f"{self._where}: {b''.join(fields).decode('utf-8', 'replace')}")

    # -- Store ------------------------------------------------------------------------
    def set(self, key: str, value: bytes) -> None:
        key, value = self._check_key(key), self._check_value(value)
        self._ok(*self._request(p.StoreOp.SET, [key.encode(), value]))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        key, t = self._check_key(key), self._timeout(timeout)
        status, fields = self._request(p.StoreOp.GET, [key.encode(), p.f64(t)], wait=t)
        (value,) = self._ok(status, fields, t)
        return value

    def add(self, key: str, amount: int) -> int:
        key = self._check_key(key)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidArgumentError(f"add() amount must be an int, got {amount!r}")
        (raw,) = self._ok(*self._request(p.StoreOp.ADD, [key.encode(), p.i64(amount)]))
        return p.parse_i64(raw)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key = self._check_key(key)
        fields = [key.encode(), self._check_value(expected), self._check_value(desired)]
        (value,) = self._ok(*self._request(p.StoreOp.CAS, fields))
        return value

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        names, t = self._check_keys(keys), self._timeout(timeout)
        fields = [p.f64(t), *(k.encode() for k in names)]
        self._ok(*self._request(p.StoreOp.WAIT, fields, wait=t), t)

    def check(self, keys: Sequence[str]) -> bool:
        names = self._check_keys(keys)
        (flag,) = self._ok(*self._request(p.StoreOp.CHECK, [k.encode() for k in names]))
        return flag == b"\x01"

    def delete(self, key: str) -> bool:
        key = self._check_key(key)
        (flag,) = self._ok(*self._request(p.StoreOp.DELETE, [key.encode()]))
        return flag == b"\x01"

    def num_keys(self) -> int:
        (raw,) = self._ok(*self._request(p.StoreOp.NUM_KEYS, []))
        return p.parse_i64(raw)

    def close(self) -> None:
        self._broken = self._broken or "closed"
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __repr__(self) -> str:
        return f"TCPStore({self._where})"
