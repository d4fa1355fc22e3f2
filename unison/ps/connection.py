"""A worker's line to one server: ordered requests out, replies matched by request id.

Requests are posted under a lock so that the header, metadata and arrays of one
request stay together on the tag. A reply thread keeps a reply receive posted
while requests are outstanding, and receives each reply's arrays straight into
the destinations the request named (the caller's buffers for a pull).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..comm.group import Group
from ..comm.work import Work
from ..errors import CollectiveTimeoutError, CommunicationError, MismatchError, PeerLostError
from .wire import (
    HEADER,
    TAG_REPLY,
    TAG_REQUEST,
    PsStatus,
    decode_error,
    pack_header,
    pack_meta,
    unpack_header,
    unpack_meta,
)

__all__ = ["ServerConnection"]


class ServerConnection:
    def __init__(self, comm: Group, server: int, index: int) -> None:
        self.comm = comm
        self.server = server
        self.index = index
        self.timeout = comm.config.timeout
        self._send_lock = threading.Lock()
        self._cv = threading.Condition()
        #: request id -> (its Work, the arrays the reply's arrays go into)
        self._pending: dict[int, tuple[Work, list[np.ndarray]]] = {}
        self._next = 0
        self._broken: BaseException | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._sends: deque[Work] = deque()

    # --- sending -----------------------------------------------------------------------
    def _post(
        self, op: int, req_id: int, clock: int, meta: dict[str, Any] | None, arrays: Sequence[Any]
    ) -> None:
        raw = pack_meta(meta)
        parts = [pack_header(op, len(arrays), req_id, clock, raw.size)]
        if raw.size:
            parts.append(raw)
        for part in [*parts, *arrays]:
            self._sends.append(self.comm.isend(part, self.server, TAG_REQUEST))
        while self._sends and self._sends[0].is_completed():
            err = self._sends.popleft().exception()
            if err is not None and self._broken is None:
                self._fail(err)

    def request(
        self,
        op: int,
        name: str,
        clock: int,
        meta: dict[str, Any] | None = None,
        arrays: Sequence[Any] = (),
        sinks: Sequence[np.ndarray] = (),
    ) -> Work:
        """Send a request; the returned Work completes with the server's reply (its
        metadata), the reply's arrays received into ``sinks``."""
        call = Work(f"{name} (server rank {self.server})")
        with self._send_lock:
            with self._cv:
                if self._broken is not None:
                    call.finish(error=self._broken)
                    return call
                self._next += 1
                req_id = self._next
                self._pending[req_id] = (call, list(sinks))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._reply_loop, name=f"unison-ps-reply-{self.server}", daemon=True
                    )
                    self._thread.start()
                self._cv.notify_all()
            self._post(op, req_id, clock, meta, arrays)
        return call

    def notify(self, op: int, clock: int) -> None:
        """A request with no reply (a clock tick)."""
        with self._send_lock:
            if self._broken is not None:
                raise self._broken
            self._post(op, 0, clock, None, ())

    # --- receiving ---------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        """Fail the connection and every pending call with ``exc``, named as this server's
        failure (which server was lost or silent, whichever send or receive met it)."""
        if isinstance(exc, CommunicationError):
            exc = self._translate(exc)
        with self._cv:
            if self._broken is None:
                self._broken = exc
            pending = list(self._pending.values())
            self._pending.clear()
        for call, _ in pending:
            call.finish(error=self._broken)

    def _translate(self, exc: CommunicationError) -> CommunicationError:
        if isinstance(exc, CollectiveTimeoutError):
            return CollectiveTimeoutError(
                f"parameter server rank {self.server} did not answer within {self.timeout:g} s",
                ranks=(self.server,),
            )
        if isinstance(exc, PeerLostError):
            return PeerLostError(
                f"parameter server rank {self.server} was lost: {exc}", ranks=(self.server,)
            )
        return exc

    def _recv(self, buf: np.ndarray) -> None:
        self.comm.irecv(buf, self.server, TAG_REPLY).wait()

    def _reply_loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._pending and not self._closing:
                        self._cv.wait()
                    if not self._pending:
                        return
                self._one_reply()
        except CommunicationError as exc:
            self._fail(exc)
        except Exception as exc:
            self._fail(CommunicationError(f"reply from server rank {self.server}: {exc!r}"))

    def _one_reply(self) -> None:
        hdr = np.empty(HEADER.size, np.uint8)
        self._recv(hdr)
        status, count, req_id, _, meta_len = unpack_header(hdr)
        meta: dict[str, Any] = {}
        if meta_len:
            raw = np.empty(meta_len, np.uint8)
            self._recv(raw)
            meta = unpack_meta(raw)
        with self._cv:
            call, sinks = self._pending.pop(req_id, (None, []))
        if call is None:
            raise CommunicationError(f"server rank {self.server} answered unknown request {req_id}")
        error: BaseException | None = None
        for i in range(count):
            sink = sinks[i] if i < len(sinks) else np.empty(0, np.uint8)
            try:
                self._recv(sink)
            except MismatchError as exc:
                error = error or exc
        if status != PsStatus.OK:
            error = decode_error(meta, call.name, self.server)
        elif count != len(sinks) and error is None:
            error = CommunicationError(f"{call.name}: expected {len(sinks)} arrays, got {count}")
        call.finish(meta, error)

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout)
