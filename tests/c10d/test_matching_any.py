"""Any-source matching in the transport's Matcher: the order guarantees, in one process."""

from __future__ import annotations

import numpy as np

from unison._types import OpSig
from unison.transport.matching import ANY_SOURCE, Matcher, Unexpected
from unison.transport.request import Request

KEY = (3, 7, 0, 5)
SIG = OpSig(0, 0, 0, 0, 1)


def _req(peer: int, key: tuple[int, int, int, int] = KEY) -> Request:
    return Request(peer, key, np.zeros(1, np.uint8), SIG)


def _msg(v: int) -> Unexpected:
    return Unexpected(bytearray([v]), SIG)


def test_any_source_takes_the_earliest_buffered_message() -> None:
    m = Matcher()
    assert m.add_unexpected(2, KEY, _msg(20)) is None
    assert m.add_unexpected(1, KEY, _msg(10)) is None
    assert m.add_unexpected(2, KEY, _msg(21)) is None
    assert m.add_unexpected(1, (3, 7, 0, 6), _msg(99)) is None  # another tag: never taken
    got = []
    for _ in range(3):
        r = _req(ANY_SOURCE)
        msg = m.post(r)
        assert msg is not None
        got.append((r.peer, msg.data[0]))
    assert got == [(2, 20), (1, 10), (2, 21)]  # arrival order; per sender, send order
    r = _req(ANY_SOURCE)
    assert m.post(r) is None and r.peer == ANY_SOURCE


def test_arrival_goes_to_the_receive_posted_first() -> None:
    m = Matcher()
    specific_old = _req(1)
    assert m.post(specific_old) is None
    any_a = _req(ANY_SOURCE)
    assert m.post(any_a) is None
    specific_new = _req(1)
    assert m.post(specific_new) is None
    any_b = _req(ANY_SOURCE)
    assert m.post(any_b) is None
    # rank 1's messages: the older specific receive, then the any-source one, then ...
    assert m.take_posted(1, KEY) is specific_old
    assert m.take_posted(1, KEY) is any_a and any_a.peer == 1
    assert m.take_posted(2, KEY) is any_b and any_b.peer == 2  # rank 2 only fits any_b
    assert m.take_posted(1, KEY) is specific_new
    assert m.take_posted(1, KEY) is None


def test_cancel_and_drop_peer_leave_any_source_receives_alone() -> None:
    m = Matcher()
    a = _req(ANY_SOURCE)
    s = _req(4)
    m.post(a)
    m.post(s)
    assert m.drop_peer(4) == [s]
    m.cancel(a)
    assert m.take_posted(4, KEY) is None
    assert m.add_unexpected(4, KEY, _msg(1)) is None and m.pending_unexpected() == 1


def test_any_source_across_two_transports_matchers() -> None:
    tcp, shm = Matcher(), Matcher()
    shm.share_any_source(tcp)
    assert shm.add_unexpected(1, KEY, _msg(1)) is None  # shm peer first
    assert tcp.add_unexpected(5, KEY, _msg(5)) is None  # then a tcp peer
    r1, r2 = _req(ANY_SOURCE), _req(ANY_SOURCE)
    assert tcp.post(r1) is not None and r1.peer == 1
    assert tcp.post(r2) is not None and r2.peer == 5
    r3 = _req(ANY_SOURCE)
    assert tcp.post(r3) is None
    assert shm.take_posted(2, KEY) is r3 and r3.peer == 2
    s = _req(2)
    shm.post(s)
    assert tcp.drop_peer(2) == []  # a peer's receives stay with its own transport
    assert shm.drop_peer(2) == [s]
