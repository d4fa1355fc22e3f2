"""Control messages between the ranks of a process set, over a unison group.

Messages are pickled Python objects (from authenticated peers of this job only).
Each travels as a fixed-size head frame (length + first bytes) and, when longer,
one tail frame, so a receiver always knows how much to post. One listener thread
per peer receives continuously and hands messages to ``deliver``; a peer that
fails or goes silent past the deadline is reported through ``on_error``.
"""

from __future__ import annotations

import pickle
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import comm as _comm  # noqa: F401  (the unison runtime must be importable)
from ..comm.api import Group, irecv, isend
from ..errors import UnisonError

__all__ = ["Channel"]

HEAD = 1024
_LEN = struct.Struct("<I")
_TAG_HEAD, _TAG_TAIL = 1, 2


class Channel:
    def __init__(
        self,
        group: Group,
        me: int,
        peers: list[int],
        deliver: Callable[[int, Any], None],
        on_error: Callable[[int, BaseException], None],
        timeout: float,
    ) -> None:
        self.group = group
        self.me = me
        self.peers = peers
        self.timeout = timeout
        self._deliver = deliver
        self._on_error = on_error
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._send_lock = threading.Lock()

    def start(self) -> None:
        for peer in self.peers:
            t = threading.Thread(
                target=self._listen, args=(peer,), name=f"unison-hvd-listen-{peer}", daemon=True
            )
            t.start()
            self._threads.append(t)

    # --- sending -----------------------------------------------------------------------
    def send(self, peer: int, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        head = np.zeros(HEAD, np.uint8)
        head[: _LEN.size] = np.frombuffer(_LEN.pack(len(data)), np.uint8)
        first = min(len(data), HEAD - _LEN.size)
        head[_LEN.size : _LEN.size + first] = np.frombuffer(data[:first], np.uint8)
        with self._send_lock:
            works = [isend(head, peer, _TAG_HEAD, self.group)]
            if len(data) > first:
                tail = np.frombuffer(data[first:], np.uint8).copy()
                works.append(isend(tail, peer, _TAG_TAIL, self.group))
        for w in works:
            w.wait()

    def send_all(self, obj: Any) -> None:
        for peer in self.peers:
            self.send(peer, obj)

    # --- receiving ------------------------------------------------------------------------
    def _listen(self, peer: int) -> None:
        while not self._stop.is_set():
            try:
                head = np.empty(HEAD, np.uint8)
                irecv(head, peer, _TAG_HEAD, self.group).wait()
                (n,) = _LEN.unpack(head[: _LEN.size].tobytes())
                first = min(n, HEAD - _LEN.size)
                data = head[_LEN.size : _LEN.size + first].tobytes()
                if n > first:
                    tail = np.empty(n - first, np.uint8)
                    irecv(tail, peer, _TAG_TAIL, self.group).wait()
                    data += tail.tobytes()
                obj = pickle.loads(data)
            except (UnisonError, OSError, RuntimeError) as exc:
                if not self._stop.is_set():
                    self._on_error(peer, exc)
                return
            if obj == "bye":
                return
            self._deliver(peer, obj)

    def close(self, say_bye: bool) -> None:
        if say_bye:
            for peer in self.peers:
                try:
                    self.send(peer, "bye")
                except Exception:
                    pass
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(0.5)
