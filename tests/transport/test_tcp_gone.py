"""Which peer a failure names when one peer was lost and another then shut down in order.

On a loaded host a rank can learn that a peer shut down (it failed on the lost peer and
left) before its own reader thread has taken the lost peer's end of stream; the error
must still name the lost peer, whose end of stream the kernel already holds. Two peers that
both left in order are not called lost, though the second's goodbye is still unread."""

from __future__ import annotations

import socket
import time

import pytest

from unison.transport.tcp import TcpTransport

from ._tcp import no_events, tcp_pair


def _rank0_after_rank2_left() -> tuple[TcpTransport, socket.socket]:
    """Rank 0's transport once rank 2 said goodbye and left, and rank 1's end of its
    connection to rank 0 (still open)."""
    me, leaver = TcpTransport(0, no_events()), TcpTransport(2, no_events())
    to_lost, lost_end = tcp_pair()
    to_leaver, leaver_end = tcp_pair()
    me.attach(1, to_lost)
    me.attach(2, to_leaver)
    leaver.attach(0, leaver_end)
    leaver.close()  # says goodbye, then closes
    deadline = time.monotonic() + 10
    while me.gone([2]) is None:
        assert time.monotonic() < deadline, "the goodbye never arrived"
        time.sleep(0.001)
    return me, lost_end


@pytest.mark.timeout(60)
def test_a_lost_peer_is_named_before_one_that_shut_down_after_it() -> None:
    for _ in range(20):
        me, lost_end = _rank0_after_rank2_left()
        try:
            shut = me.gone([1, 2])
            assert shut is not None and "rank 2 has shut down" in str(shut), shut
            assert me.explain(shut, [1, 2]) is shut  # rank 1 is still there
            lost_end.close()  # rank 1 dies: no goodbye
            # at once: rank 0's reader may not have taken rank 1's end of stream yet
            for err in (me.gone([1, 2]), me.explain(shut, [1, 2])):
                assert err is not None and "lost connection to rank 1" in str(err), err
                assert err.ranks == (1,)
        finally:
            me.close()


@pytest.mark.timeout(60)
def test_a_lost_peer_is_reported_as_itself() -> None:
    me, lost_end = _rank0_after_rank2_left()
    try:
        lost_end.close()
        deadline = time.monotonic() + 10
        while (err := me.gone([1])) is None:
            assert time.monotonic() < deadline, "the end of stream was never taken"
            time.sleep(0.001)
        assert "lost connection to rank 1" in str(err)
        assert me.explain(err, [1, 2]) is err
    finally:
        me.close()


@pytest.mark.timeout(60)
def test_two_peers_that_shut_down_in_order_are_not_called_lost() -> None:
    for _ in range(20):
        me, rank1_end = _rank0_after_rank2_left()
        rank1 = TcpTransport(1, no_events())
        try:
            shut = me.gone([2])
            assert shut is not None
            # rank 1 leaves in order too; its goodbye may still be unread when asked
            rank1.attach(0, rank1_end)
            rank1.close()
            err = me.explain(shut, [1, 2])
            assert "lost connection" not in str(err), err
        finally:
            me.close()
