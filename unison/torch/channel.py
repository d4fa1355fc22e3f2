"""Control messages between the ranks of a process set, over a unison group.

Messages are pickled Python objects (from authenticated peers of this job only).
Each travels as a fixed-size head frame (length + first bytes) and, when longer,
one tail frame, so a receiver always knows how much to post. One listener thread
per peer receives continuously and hands messages to ``deliver``; a peer that
fails or goes silent past the deadline is reported through ``on_error``.

The head receive from each peer is always posted (a *slot*). The thread running a
negotiation cycle does not wait for the listener to hand it a message: it waits on
the posted receive itself (:meth:`NegotiationChannel.pull`), so on the shared-memory transport
its own wait drives the ring and no thread hand-off lies on the critical path.
Whoever sees the receive complete first takes the message; it is delivered exactly
once, in order per peer, under the slot's lock.
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
from ..comm.work import Work
from ..errors import CollectiveTimeoutError, UnisonError

__all__ = ["NegotiationChannel"]

HEAD = 1024
_LEN = struct.Struct("<I")
_TAG_HEAD, _TAG_TAIL = 1, 2
_BYE = object()  # a peer said goodbye: its slot is closed


class _Slot:
    """The posted head receive from one peer."""

    __slots__ = ("buf", "closed", "lock", "work")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buf = np.empty(HEAD, np.uint8)
        self.work: Work | None = None
        self.closed = False


class NegotiationChannel:
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
        self._slots = {peer: _Slot() for peer in peers}

    def start(self) -> None:
        for peer, slot in self._slots.items():
            slot.work = irecv(slot.buf, peer, _TAG_HEAD, self.group)
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
    def posted(self, peer: int) -> Work | None:
        """The receive the next message from ``peer`` lands in (see :meth:`pull`)."""
        slot = self._slots[peer]
        return None if slot.closed else slot.work

    def pull(self, peer: int, work: Work | None, timeout: float) -> None:
        """Wait up to ``timeout`` on ``work`` (what :meth:`posted` said) in this thread and
        deliver its message if nobody has. Errors are left to the listener to report."""
        if work is None:  # the peer said goodbye (the engine knows): nothing will come
            self._stop.wait(min(timeout, 0.05))
            return
        try:
            work.wait(timeout)
        except CollectiveTimeoutError:
            if not work.is_completed():
                return
        except (UnisonError, OSError, RuntimeError):
            return
        try:
            self._take(peer, work)
        except (UnisonError, OSError, RuntimeError):
            return

    def _take(self, peer: int, work: Work) -> object:
        """Parse and deliver the message ``work`` received, unless another thread has;
        then post the next head receive. Returns the message (None: taken already)."""
        slot = self._slots[peer]
        with slot.lock:
            if slot.work is not work or slot.closed:
                return None
            work.wait()  # done: re-raises its error
            head = slot.buf
            (n,) = _LEN.unpack(head[: _LEN.size].tobytes())
            first = min(n, HEAD - _LEN.size)
            data = head[_LEN.size : _LEN.size + first].tobytes()
            if n > first:
                tail = np.empty(n - first, np.uint8)
                irecv(tail, peer, _TAG_TAIL, self.group).wait()
                data += tail.tobytes()
            obj = pickle.loads(data)
            if obj == "bye":
                slot.closed = True
                self._deliver(peer, obj)
                return _BYE
            # deliver before posting the next receive: a thread that found the message
            # missing while holding the engine's lock then still sees this receive posted
            self._deliver(peer, obj)
            slot.buf = np.empty(HEAD, np.uint8)
            slot.work = irecv(slot.buf, peer, _TAG_HEAD, self.group)
            return obj

    def _listen(self, peer: int) -> None:
        slot = self._slots[peer]
        while not self._stop.is_set():
            try:
                work = slot.work
                if work is None or slot.closed:
                    return
                work.wait()
                if self._take(peer, work) is _BYE:
                    return
            except (UnisonError, OSError, RuntimeError) as exc:
                if not self._stop.is_set():
                    self._on_error(peer, exc)
                return

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
