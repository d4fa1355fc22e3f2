"""A caller waiting for a small TCP message reads its peer's socket itself.

Two real transports over a loopback connection. The waiting thread must deliver its
own frame and any other frame that comes first (posted, unexpected, mismatched), the
reader thread must still deliver what no caller reads (a large message, a wait that
outlasts the caller's window), and a peer lost while the caller reads must fail the
wait at once, naming the peer."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from unison._types import OpSig
from unison.errors import MismatchError, PeerLostError
from unison.transport.base import Events
from unison.transport.framing import FrameKind
from unison.transport.tcp import TcpTransport

from ._tcp import no_events, tcp_pair

SIG = OpSig(1, 2, 0, -1, 2)
INLINE = 1 << 16


def _key(tag: int) -> tuple[int, int, int, int]:
    return (int(FrameKind.COLL), 0, 1, tag)


@pytest.fixture
def pair():
    """(sender as rank 0, receiver as rank 1, the receiver's record of which thread
    delivered each posted receive)."""
    a, b = tcp_pair()
    sender, receiver = TcpTransport(0, no_events(), INLINE), TcpTransport(1, no_events(), INLINE)
    sender.attach(1, a)
    receiver.attach(0, b)
    delivered: list[str] = []
    take = receiver.matcher.take_posted

    def recording(peer, key):
        req = take(peer, key)
        if req is not None:
            delivered.append(threading.current_thread().name)
        return req

    receiver.matcher.take_posted = recording  # type: ignore[method-assign]
    yield sender, receiver, delivered
    sender.close()
    receiver.close()


def _send(t: TcpTransport, tag: int, data: np.ndarray) -> None:
    req = t.isend(1, _key(tag), data.view(np.uint8), SIG, time.monotonic() + 10)
    assert req.wait(10)


def _later(delay: float, fn, *args) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn(*args)

    th = threading.Thread(target=run)
    th.start()
    return th


@pytest.mark.timeout(60)
def test_the_waiting_thread_delivers_its_own_small_message(pair) -> None:
    sender, receiver, delivered = pair
    rng = np.random.default_rng(0)
    for i in range(50):
        want = rng.random(2).astype(np.float32)
        got = np.zeros(2, np.float32)
        req = receiver.irecv(0, _key(i), got.view(np.uint8), SIG)
        th = _later(0.001, _send, sender, i, want)  # arrives while the caller waits
        assert receiver.wait(req, 10)
        th.join()
        np.testing.assert_array_equal(got, want)
    # the reader thread rests while callers read: nearly every frame was the caller's
    assert delivered.count("MainThread") >= 45, delivered


@pytest.mark.timeout(60)
def test_frames_of_other_receives_read_meanwhile_are_delivered(pair) -> None:
    sender, receiver, _ = pair
    first, second, early = (np.full(2, v, np.float32) for v in (1.0, 2.0, 3.0))
    a, b = np.zeros(2, np.float32), np.zeros(2, np.float32)
    ra = receiver.irecv(0, _key(1), a.view(np.uint8), SIG)
    rb = receiver.irecv(0, _key(2), b.view(np.uint8), SIG)

    def send_all() -> None:
        _send(sender, 3, early)  # nobody has posted its receive yet: kept aside
        _send(sender, 2, second)
        _send(sender, 1, first)

    th = _later(0.001, send_all)
    assert receiver.wait(ra, 10)  # reads tag 3, then tag 2, then its own
    th.join()
    assert rb.done() and receiver.wait(rb, 0)
    np.testing.assert_array_equal(a, first)
    np.testing.assert_array_equal(b, second)
    c = np.zeros(2, np.float32)
    rc = receiver.irecv(0, _key(3), c.view(np.uint8), SIG)
    assert receiver.wait(rc, 0)
    np.testing.assert_array_equal(c, early)


@pytest.mark.timeout(60)
def test_the_reader_delivers_what_no_caller_reads(pair) -> None:
    sender, receiver, delivered = pair
    x = np.zeros(2, np.float32)
    small = receiver.irecv(0, _key(1), x.view(np.uint8), SIG)
    _later(0.001, _send, sender, 1, np.ones(2, np.float32)).join()
    assert receiver.wait(small, 10)  # the caller now holds the lease
    # a large message goes to the reader thread, woken by the wait
    big = np.zeros(INLINE, np.float32)
    req = receiver.irecv(0, _key(2), big.view(np.uint8), SIG)
    th = _later(0.001, _send, sender, 2, np.arange(INLINE, dtype=np.float32))
    assert receiver.wait(req, 10)
    th.join()
    np.testing.assert_array_equal(big, np.arange(INLINE, dtype=np.float32))
    assert delivered[-1].startswith("unison-tcp-read"), delivered
    # a small message that comes after the caller's window: the reader delivers it
    y = np.zeros(2, np.float32)
    late = receiver.irecv(0, _key(3), y.view(np.uint8), SIG)
    assert not receiver.wait(late, 0.02)  # nothing yet: the wait times out
    _send(sender, 3, np.full(2, 7.0, np.float32))
    assert late.wait(10)
    np.testing.assert_array_equal(y, 7.0)
    assert delivered[-1].startswith("unison-tcp-read"), delivered


@pytest.mark.timeout(60)
def test_a_frame_that_does_not_fit_fails_the_waiting_receive(pair) -> None:
    sender, receiver, _ = pair
    x = np.zeros(2, np.float32)
    req = receiver.irecv(0, _key(1), x.view(np.uint8), SIG)
    th = _later(0.001, _send, sender, 1, np.zeros(4, np.float32))
    with pytest.raises(MismatchError, match="rank 0 sent 16 bytes for a message of 8 bytes"):
        receiver.wait(req, 10)
    th.join()
    # the connection goes on: the next message arrives whole
    y = np.zeros(2, np.float32)
    nxt = receiver.irecv(0, _key(2), y.view(np.uint8), SIG)
    _send(sender, 2, np.full(2, 5.0, np.float32))
    assert receiver.wait(nxt, 10)
    np.testing.assert_array_equal(y, 5.0)


@pytest.mark.timeout(60)
def test_a_peer_lost_while_the_caller_reads_fails_the_wait_at_once() -> None:
    a, b = tcp_pair()
    lost: list[tuple[int, str]] = []
    receiver = TcpTransport(
        1,
        Events(peer_lost=lambda p, r, g: lost.append((p, r)), abort=lambda p, i: None),
        INLINE,
    )
    receiver.attach(0, b)
    try:
        x = np.zeros(2, np.float32)
        req = receiver.irecv(0, _key(1), x.view(np.uint8), SIG)
        _later(0.002, a.close)  # the peer dies: no goodbye, no message
        t0 = time.monotonic()
        with pytest.raises(PeerLostError, match="lost connection to rank 0") as info:
            receiver.wait(req, 30)
        assert time.monotonic() - t0 < 5
        assert info.value.ranks == (0,)
        assert lost and lost[0][0] == 0
    finally:
        receiver.close()
