"""Control messages between the ranks of a process set, over a unison group.

Messages are pickled Python objects (from authenticated peers of this job only).
Each travels as a fixed-size head frame (length + first bytes) and, when longer,
one tail frame from the same sender, so a receiver always knows how much to post.

One head receive from *any* peer of the set is always posted (the *slot*); its
Work names the sender. Whoever needs a message waits on that one receive: the
thread running a negotiation cycle waits on it itself (:meth:`NegotiationChannel.pull`),
driving the transport, so no thread hand-off lies on the critical path; between
cycles one watcher thread (:meth:`NegotiationChannel.start`) waits on it without
driving the transport where the transport allows (it blocks on the request until
the transport's own progress completes it), so it never competes with the cycle
thread for the processor or the interpreter lock. Whoever sees the receive complete
first takes the message; it is delivered exactly once, in order per peer, under the
slot's lock. An any-source receive outlives a lost peer, so one never-matched
receive per peer (the *sentinel*) is posted too: the transport fails it when the peer
is lost, and :meth:`NegotiationChannel.check_peers` (called whenever a wait for
messages has gone :data:`_CHECK_S` without one, asleep) reports it. The watcher waits on the
receive only while the engine wants messages at once (``need()``: it has work
pending, see :meth:`NegotiationChannel.watch`); otherwise it looks every ``poll``
seconds, so a rank with nothing to do costs no wake-up per message. A peer that fails
or goes silent past the deadline is reported through ``on_error``.
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
_TAG_HEAD, _TAG_TAIL, _TAG_ALIVE = 1, 2, 3
#: a wait for messages (asleep after its first slice) checks the peers' sentinels this
#: often: a lost peer is reported within this time, at one wake-up per period
_CHECK_S = 0.05
_ROOM = HEAD - _LEN.size


class NegotiationChannel:
    def __init__(
        self,
        group: Group,
        me: int,
        peers: list[int],
        deliver: Callable[[int, Any, bool], None],
        on_error: Callable[[int, BaseException], None],
        need: Callable[[], bool],
        poll: float,
    ) -> None:
        self.group = group
        self.me = me
        self.peers = peers
        self.poll = poll
        self._deliver = deliver
        self._on_error = on_error
        self._need = need
        self._stop = threading.Event()
        self._nudge = threading.Event()
        self._thread: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._head = np.zeros(HEAD, np.uint8)  # the send head (guarded by _send_lock)
        # the posted head receive from any peer (guarded by _lock)
        self._lock = threading.Lock()
        self._buf = np.empty(HEAD, np.uint8)
        self._work: Work | None = None
        self._open = set(peers)  # peers that have not said goodbye
        self._alive: dict[int, Work] = {}  # per peer: a receive nothing matches
        self._alive_buf = np.empty(1, np.uint8)
        #: messages the watcher thread delivered (the rest: the cycle thread itself)
        self.watched = 0
        #: :meth:`pull` sleeps until the transport's own progress completes the receive
        #: instead of driving it (spin, yield): set where this host's ranks outnumber its
        #: cores, where a spinning or yielding waiter takes the processor from the peer
        #: whose message it waits for (per op at np=4 on 2 cores: 25 % less CPU, a third
        #: of the involuntary context switches)
        self.sleep_wait = False
        #: answer and deliver peers' messages at once, idle or not: set where the posted
        #: any-source receive has no transport request to sleep on (the mpi and torch
        #: backends), where an idle rank's delayed answer held a peer's cycle up to
        #: ``poll`` seconds (np=3 on the torch backend: ops of 1-10 s)
        self.prompt = False
        #: between cycles, take peers' messages at once even with nothing pending (set by
        #: the engine while the next cycle is gathered in one collective: a message that
        #: comes point to point then is a peer's cycle that did not fit, or its goodbye)
        self.listen = False
        #: the watcher waits on the posted receive now (no nudge needed to listen)
        self.watching = False

    def start(self) -> None:
        if not self.peers:
            return
        self._work = irecv(self._buf, None, _TAG_HEAD, self.group)
        self.prompt = self._work.request is None
        if self._work.request is not None:
            # unison's own transports keep an any-source receive posted past a lost peer
            # (MPI and Gloo fail it, or end the job): there, watch each peer's sentinel
            for peer in self.peers:
                self._alive[peer] = irecv(self._alive_buf, peer, _TAG_ALIVE, self.group)
        self._thread = threading.Thread(target=self._watch, name="unison-hvd-listen", daemon=True)
        self._thread.start()

    # --- sending -----------------------------------------------------------------------
    def send_all(self, obj: Any) -> None:
        """Send ``obj`` to every peer (that has not said goodbye) and wait until it left."""
        if not self.peers:
            return
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(data)
        first = min(n, _ROOM)
        with self._send_lock:
            head = self._head
            _LEN.pack_into(head.data, 0, n)
            head[_LEN.size : _LEN.size + first] = np.frombuffer(data, np.uint8, first)
            tail = np.frombuffer(data, np.uint8, offset=first) if n > first else None
            works = []
            for peer in self.peers:
                works.append(isend(head, peer, _TAG_HEAD, self.group))
                if tail is not None:
                    works.append(isend(tail, peer, _TAG_TAIL, self.group))
            for w in works:
                w.wait()

    # --- receiving ------------------------------------------------------------------------
    def posted(self) -> Work | None:
        """The receive the next message lands in (see :meth:`pull`); None once every
        peer has said goodbye. Lock-free: the engine asks holding its own lock, which
        :meth:`_take` takes inside this channel's to deliver."""
        return self._work

    def pull(self, work: Work | None, timeout: float, asleep: bool = False) -> None:
        """Wait up to ``timeout`` on ``work`` (what :meth:`posted` said) in this thread,
        driving the transport (or asleep: ``asleep`` or :attr:`sleep_wait`), and deliver
        its message if nobody has. Errors are left to the watcher to report."""
        if work is None:  # every peer said goodbye (the engine knows): nothing will come
            self._stop.wait(min(timeout, 0.05))
            return
        try:
            if self.sleep_wait or asleep:
                if not _block(work, timeout):
                    return
            else:
                work.wait(timeout)
        except CollectiveTimeoutError:
            if not work.is_completed():
                return
        except (UnisonError, OSError, RuntimeError):
            return
        try:
            self._take(work)
        except (UnisonError, OSError, RuntimeError):
            return

    def check_peers(self) -> None:
        """Report a peer the transport has lost (its sentinel receive failed)."""
        for peer in sorted(self._open):
            w = self._alive.get(peer)
            if w is None:
                continue
            req = w.request  # a flag read, where there is one (no transport progress)
            if (req is not None and not req.done()) or not w.is_completed():
                continue
            exc = w.exception()
            if isinstance(exc, CollectiveTimeoutError) or exc is None:  # its deadline: renew
                self._alive[peer] = irecv(self._alive_buf, peer, _TAG_ALIVE, self.group)
                continue
            if peer in self._open and not self._stop.is_set():
                self._settle()  # its goodbye may have come just before it shut down
                if peer in self._open:
                    self._on_error(peer, exc)

    def forget(self, peers: list[int]) -> None:
        """Peers whose goodbye came another way (a gathered cycle's record): their
        transport shutting down is no loss."""
        with self._lock:
            self._open.difference_update(peers)

    def _settle(self) -> None:
        """Take every message that has already arrived (not under the engine's lock)."""
        while True:
            work = self._work
            if work is None or not work.is_completed():
                return
            try:
                if not self._take(work):
                    return
            except (UnisonError, OSError, RuntimeError):
                return

    def _take(self, work: Work, watcher: bool = False, late: bool = False) -> bool:
        """Parse and deliver the message ``work`` received, unless another thread has;
        then post the next head receive. False: the slot is closed (every peer left).
        ``late``: found by the idle watcher's look, so it may have waited a while."""
        with self._lock:
            if self._work is not work:
                return self._work is not None
            work.wait()  # done: re-raises its error
            peer = work.source
            assert peer is not None
            head = self._buf
            (n,) = _LEN.unpack_from(head.data)
            data = head[_LEN.size : _LEN.size + min(n, _ROOM)].tobytes()
            if n > _ROOM:
                tail = np.empty(n - _ROOM, np.uint8)
                irecv(tail, peer, _TAG_TAIL, self.group).wait()
                data += tail.tobytes()
            obj = pickle.loads(data)
            self.watched += watcher
            if obj == "bye":
                self._open.discard(peer)
            # deliver before posting the next receive: a thread that found the message
            # missing while holding the engine's lock then still sees this receive posted
            self._deliver(peer, obj, late)
            if not self._open:
                self._work = None
                return False
            self._work = irecv(head, None, _TAG_HEAD, self.group)
            return True

    def watch(self) -> None:
        """The engine wants messages at once now (``need()`` turned true)."""
        self._nudge.set()

    def _watch(self) -> None:
        """Between cycles: wait for the next message without driving the transport."""
        while not self._stop.is_set():
            work = self._work
            if work is None:
                return
            try:
                late = False
                need = self._need()
                self.watching = need or self.listen
                if self.prompt or need or self.listen:
                    # work pending: a lost peer matters now (checked every _CHECK_S,
                    # asleep in between); only listening: the next cycle checks anyway
                    if self.prompt:  # no sentinels there: the transport reports a loss
                        t = min(self.poll, 1.0)
                    else:
                        t = _CHECK_S if need else self.poll
                    done = _block(work, t)
                    if not done:
                        self.check_peers()
                else:
                    self._nudge.wait(self.poll)
                    self._nudge.clear()
                    if self._stop.is_set():
                        return
                    done = late = False if self._need() else work.is_completed()
                if done and not self._take(work, watcher=True, late=late):
                    return
            except (UnisonError, OSError, RuntimeError) as exc:
                if not self._stop.is_set():
                    with self._lock:
                        peers = sorted(self._open)
                    self._on_error(_culprit(exc, peers), exc)
                return

    def close(self, say_bye: bool) -> None:
        if say_bye:
            try:
                self.send_all("bye")
            except Exception:
                pass
        self._stop.set()
        self._nudge.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(0.5)


def _block(work: Work, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``work`` to finish. A receive whose transport makes
    progress on its own (shared memory's doorbell thread) is waited on without driving
    the transport (:meth:`Work.wait_quiet`): a thread that runs a cycle meanwhile drives
    it alone."""
    return work.wait_quiet(timeout)


def _culprit(exc: BaseException, peers: list[int]) -> int:
    ranks = getattr(exc, "ranks", None) or ()
    for r in ranks:
        if r in peers:
            return int(r)
    return peers[0] if peers else -1
