"""The transport conformance suite: what every transport must do, run on real ranks.

Each ``case_*`` function runs on every rank of a job started by
:func:`unison.testing.run_ranks` (with ``UNISON_TRANSPORT`` naming the transport
under test) and talks through the fabric's Router interface, so the same code
exercises TCP, shared memory and any later transport. A case first checks that
its peers really are routed through the expected transport, then asserts on
the transport's semantics: order per key, zero-length messages, messages larger
than any ring, many keys at once, mismatches, timeouts, a peer closing mid-way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from .._types import OpSig
from ..backends.native.fabric import Fabric
from ..errors import MismatchError, PeerLostError
from ..transport.framing import FrameKind
from ..transport.request import Request

__all__ = ["CASES", "EXPECTED", "fabric", "key", "payload"]

#: UNISON_TRANSPORT value -> transport name every same-host peer must be routed by
EXPECTED = {"tcp": "tcp", "shm": "shm", "auto": "shm"}
_GROUP = 77  # no communicator has this id: frames stay at the transport level
_LONG = 30.0


def fabric(expected: str) -> Fabric:
    """This rank's fabric, after checking every peer is routed by ``expected``."""
    from ..backends.native.runtime import Runtime
    from ..world import current

    rt = current()
    assert isinstance(rt, Runtime), "the conformance cases run on the native engine"
    fab = rt.fabric
    routes = {peer: t.name for peer, t in fab.route.items()}
    bad = {p: n for p, n in routes.items() if n != expected}
    if bad:
        raise AssertionError(f"expected every peer on {expected}, routes are {routes}")
    return fab


def key(tag: int, seq: int = 0) -> tuple[int, int, int, int]:
    return (int(FrameKind.P2P), _GROUP, seq, tag)


def sig(n: int) -> OpSig:
    return OpSig(op=1, dtype=1, count=n)


def payload(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _wait(req: Request, what: str, timeout: float = _LONG) -> None:
    if not req.wait(timeout):
        raise AssertionError(f"{what}: not done within {timeout}s")


def _rank() -> int:
    from ..world import current

    return current().rank


def case_order_per_key(expected: str) -> int:
    """60 messages under one key arrive in order; half before their receive is posted."""
    fab = fabric(expected)
    n = 60
    if _rank() == 0:
        reqs = [fab.isend(1, key(5), payload(100 + i, i), sig(100 + i), time.monotonic() + _LONG)
                for i in range(n)]  # fmt: skip
        for r in reqs:
            _wait(r, "send")
    else:
        time.sleep(0.2)  # let the first half arrive unexpected
        for i in range(n):
            buf = np.zeros(100 + i, np.uint8)
            _wait(fab.irecv(0, key(5), buf, sig(100 + i)), f"message {i}")
            assert np.array_equal(buf, payload(100 + i, i)), f"message {i} out of order"
    return n


def case_zero_length(expected: str) -> int:
    """Zero-byte messages, expected and unexpected, interleaved with data."""
    fab = fabric(expected)
    empty = np.zeros(0, np.uint8)
    if _rank() == 0:
        for t in range(4):
            _wait(fab.isend(1, key(t), empty, sig(0), time.monotonic() + _LONG), "send")
        _wait(fab.isend(1, key(9), payload(10, 1), sig(10), time.monotonic() + _LONG), "send")
    else:
        first = fab.irecv(0, key(0), np.zeros(0, np.uint8), sig(0))
        _wait(first, "posted zero-length")
        time.sleep(0.1)
        for t in (3, 2, 1):
            _wait(fab.irecv(0, key(t), np.zeros(0, np.uint8), sig(0)), f"zero-length {t}")
        buf = np.zeros(10, np.uint8)
        _wait(fab.irecv(0, key(9), buf, sig(10)), "data after zero-length")
        assert np.array_equal(buf, payload(10, 1))
    return 0


def case_larger_than_ring(expected: str) -> int:
    """Messages many times any ring, posted before and after arrival, both ways at once."""
    fab = fabric(expected)
    n = 5 << 20
    me = _rank()
    other = 1 - me
    out = payload(n, 10 + me)
    got_posted = np.zeros(n, np.uint8)
    r1 = fab.irecv(other, key(1), got_posted, sig(n))
    s1 = fab.isend(other, key(1), out, sig(n), time.monotonic() + _LONG)
    s2 = fab.isend(other, key(2), out[::-1].copy(), sig(n), time.monotonic() + _LONG)
    _wait(r1, "posted large receive")
    time.sleep(0.1)
    got_late = np.zeros(n, np.uint8)
    _wait(fab.irecv(other, key(2), got_late, sig(n)), "late large receive")
    _wait(s1, "send 1")
    _wait(s2, "send 2")
    want = payload(n, 10 + other)
    assert np.array_equal(got_posted, want), "posted large message corrupted"
    assert np.array_equal(got_late, want[::-1]), "unexpected large message corrupted"
    return n


def case_many_keys(expected: str) -> int:
    """300 keys in flight at once; the receiver posts them in reverse order."""
    fab = fabric(expected)
    n = 300
    if _rank() == 0:
        reqs = [fab.isend(1, key(t, seq=t % 7), payload(t % 50 * 37, t), sig(t % 50 * 37),
                          time.monotonic() + _LONG) for t in range(n)]  # fmt: skip
        for r in reqs:
            _wait(r, "send")
    else:
        bufs = {t: np.zeros(t % 50 * 37, np.uint8) for t in range(n)}
        posted = {t: fab.irecv(0, key(t, seq=t % 7), bufs[t], sig(t % 50 * 37))
                  for t in reversed(range(n))}  # fmt: skip
        for t, r in posted.items():
            _wait(r, f"key {t}")
            assert np.array_equal(bufs[t], payload(t % 50 * 37, t)), f"key {t} corrupted"
    return n


def case_mismatch(expected: str) -> int:
    """A wrong length or a wrong signature fails the receive with the sender's signature."""
    fab = fabric(expected)
    if _rank() == 0:
        for t, n in ((1, 8), (2, 8), (3, 4000)):
            _wait(fab.isend(1, key(t), payload(n, t), sig(n), time.monotonic() + _LONG), "send")
        _wait(fab.isend(1, key(4), payload(16, 4), sig(16), time.monotonic() + _LONG), "send")
    else:
        cases = [(1, 16, sig(16)), (2, 8, OpSig(op=3, dtype=1, count=8)), (3, 10, sig(10))]
        for t, n, s in cases:
            req = fab.irecv(0, key(t), np.zeros(n, np.uint8), s)
            try:
                req.wait(_LONG)
            except MismatchError as exc:
                assert req.sender_sig is not None, "mismatch without the sender's signature"
                assert getattr(exc, "sender_sig", None) == req.sender_sig
            else:
                raise AssertionError(f"message {t}: mismatch not detected")
        buf = np.zeros(16, np.uint8)  # the stream is intact after the mismatches
        _wait(fab.irecv(0, key(4), buf, sig(16)), "message after mismatches")
        assert np.array_equal(buf, payload(16, 4))
    return 0


def case_timeout(expected: str) -> float:
    """A receive nobody sends to reports not-done at its timeout, then can be cancelled."""
    fab = fabric(expected)
    other = 1 - _rank()
    req = fab.irecv(other, key(99), np.zeros(8, np.uint8), sig(8))
    t0 = time.monotonic()
    done = req.wait(0.3)
    took = time.monotonic() - t0
    assert not done, "a receive with no sender completed"
    assert took < 5.0, f"wait(0.3) returned after {took:.1f}s"
    fab.cancel(other, req)
    # meet before leaving, so neither rank's exit lands inside the other's wait
    back = fab.irecv(other, key(100), np.zeros(1, np.uint8), sig(1))
    fab.isend(other, key(100), np.ones(1, np.uint8), sig(1), time.monotonic() + _LONG)
    _wait(back, "closing handshake")
    return took


def case_peer_dies_mid_message(expected: str) -> str:
    """Rank 1 dies while streaming a message larger than any ring; rank 0 fails fast."""
    fab = fabric(expected)
    n = 64 << 20
    if _rank() == 1:
        fab.isend(0, key(1), np.ones(n, np.uint8), sig(n), time.monotonic() + _LONG)
        time.sleep(0.01)  # part of the message is on its way
        os._exit(3)
    time.sleep(0.05)
    req = fab.irecv(1, key(1), np.zeros(n, np.uint8), sig(n))
    t0 = time.monotonic()
    try:
        req.wait(_LONG)
    except PeerLostError as exc:
        assert time.monotonic() - t0 < _LONG / 2
        return str(exc)
    raise AssertionError("the receive from a dead rank completed")


def case_close_after_send(expected: str) -> int:
    """Data sent before an orderly shutdown is still delivered; later receives fail cleanly."""
    fab = fabric(expected)
    if _rank() == 1:
        _wait(fab.isend(0, key(1), payload(3000, 7), sig(3000), time.monotonic() + _LONG), "s")
        from .. import shutdown

        shutdown()
        return 0
    time.sleep(0.5)  # rank 1 has said goodbye by now
    buf = np.zeros(3000, np.uint8)
    _wait(fab.irecv(1, key(1), buf, sig(3000)), "message sent before goodbye")
    assert np.array_equal(buf, payload(3000, 7))
    late = fab.irecv(1, key(2), np.zeros(8, np.uint8), sig(8))
    try:
        late.wait(_LONG)
    except PeerLostError:
        return 1
    raise AssertionError("a receive from a rank that shut down completed")


#: name -> (case, world size); fault cases are run with run_ranks and judged per rank
CASES: dict[str, tuple[Callable[[str], object], int]] = {
    "order_per_key": (case_order_per_key, 2),
    "zero_length": (case_zero_length, 2),
    "larger_than_ring": (case_larger_than_ring, 2),
    "many_keys": (case_many_keys, 2),
    "mismatch": (case_mismatch, 2),
    "timeout": (case_timeout, 2),
    "peer_dies_mid_message": (case_peer_dies_mid_message, 2),
    "close_after_send": (case_close_after_send, 2),
}
