"""Point-to-point: ordering per tag, independent tags, non-blocking forms, sizes."""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison.testing import spawn

pytestmark = pytest.mark.timeout(60)


def _ordering() -> None:
    r = un.rank()
    if r == 0:
        for i in range(20):
            un.send(np.full(4, i, np.int32), dst=1, tag=7)
        un.send(np.array([1.0]), dst=1, tag=1)
        un.send(np.array([2.0]), dst=1, tag=2)
    else:
        for i in range(20):
            x = np.empty(4, np.int32)
            un.recv(x, src=0, tag=7)
            assert (x == i).all(), (i, x)
        b, a = np.empty(1), np.empty(1)
        un.recv(b, src=0, tag=2)  # tags are matched independently
        un.recv(a, src=0, tag=1)
        assert (a[0], b[0]) == (1.0, 2.0)


def test_ordering_per_tag_and_independent_tags() -> None:
    spawn(_ordering, 2)


def _nonblocking() -> list[int]:
    r, p = un.rank(), un.size()
    sends, recvs, bufs = [], [], []
    for peer in range(p):
        if peer == r:
            continue
        for tag in range(5):
            sends.append(un.isend(np.full(100, r * 10 + tag, np.int64), dst=peer, tag=tag))
            buf = np.empty(100, np.int64)
            bufs.append((peer, tag, buf))
            recvs.append(un.irecv(buf, src=peer, tag=tag))
    for w in sends + recvs:
        assert w.wait() is True
        assert w.is_completed() and w.exception() is None
    for peer, tag, buf in bufs:
        assert (buf == peer * 10 + tag).all()
    return [len(sends)]


def test_isend_irecv_many_in_flight() -> None:
    assert spawn(_nonblocking, 4) == [[15]] * 4


def _sizes() -> None:
    r = un.rank()
    for n in (0, 1, 7, 100_000, 3_000_001):
        if r == 0:
            un.send(np.arange(n, dtype=np.float32), dst=1)
        else:
            x = np.empty(n, np.float32)
            un.recv(x, src=0)
            assert np.array_equal(x, np.arange(n, dtype=np.float32))


def test_zero_and_large_messages() -> None:
    spawn(_sizes, 2)


def _size_mismatch() -> str:
    if un.rank() == 0:
        un.send(np.zeros(10, np.float32), dst=1)
        return ""
    try:
        un.recv(np.empty(11, np.float32), src=0)
    except un.MismatchError as exc:
        return str(exc)
    raise AssertionError("no error")


def test_recv_of_wrong_size_is_a_mismatch() -> None:
    msg = spawn(_size_mismatch, 2)[1]
    assert "rank 0" in msg and "float32 x 10" in msg and "x 11" in msg


def _bad_args() -> None:
    with pytest.raises(un.InvalidArgumentError, match="itself"):
        un.send(np.zeros(1), dst=un.rank())
    with pytest.raises(un.InvalidArgumentError, match="not a rank"):
        un.send(np.zeros(1), dst=9)
    with pytest.raises(un.InvalidArgumentError, match="tag"):
        un.isend(np.zeros(1), dst=1 - un.rank(), tag=-1)
    with pytest.raises(un.InvalidArgumentError, match="contiguous"):
        un.send(np.zeros((4, 4))[:, 1], dst=1 - un.rank())


def test_bad_arguments_raise_before_sending() -> None:
    spawn(_bad_args, 2)


def _timed_out_recv_is_withdrawn() -> None:
    import time

    r = un.rank()
    if r == 0:
        time.sleep(3.0)  # rank 1's first receive (deadline 2 s) has timed out by now
        un.send(np.full(3, 7.0), dst=1, tag=5)
    else:
        a = np.zeros(3)
        with pytest.raises(un.CollectiveTimeoutError, match="rank 0"):
            un.irecv(a, src=0, tag=5).wait()
        b = np.zeros(3)
        un.irecv(b, src=0, tag=5).wait(timeout=10)
        assert (b == 7.0).all() and (a == 0).all()


def test_a_timed_out_receive_does_not_swallow_the_next_message() -> None:
    spawn(_timed_out_recv_is_withdrawn, 2, env={"UNISON_TIMEOUT": "2"})


def _wait_quiet() -> list[object]:
    """``Work.wait_quiet`` on native point-to-point: False while the message has not come,
    True once it has (the buffer filled), True without raising for a failed receive whose
    ``wait()`` raises; an async collective's Work (no request underneath) waits too."""
    r = un.rank()
    got: list[object] = []
    if r == 0:
        un.recv(np.empty(1), src=1, tag=1)  # rank 1 has timed its first wait out
        un.send(np.arange(5, dtype=np.int64), dst=1, tag=2)
        un.send(np.zeros(10, np.float32), dst=1, tag=3)
    else:
        a = np.zeros(5, np.int64)
        w = un.irecv(a, src=0, tag=2)
        got.append(w.wait_quiet(0.2))  # nothing sent yet
        un.send(np.zeros(1), dst=0, tag=1)
        got.append(w.wait_quiet(30))
        got.append(a.tolist())
        bad = un.irecv(np.empty(11, np.float32), src=0, tag=3)
        got.append(bad.wait_quiet(30))  # finished, with an error it does not raise
        with pytest.raises(un.MismatchError, match="x 11"):
            bad.wait()
    x = np.full(3, r + 1.0)
    w2 = un.all_reduce(x, async_op=True)
    assert w2 is not None
    got.append(w2.wait_quiet(30))
    got.append(x.tolist())
    return got


def test_wait_quiet_on_native_requests() -> None:
    outs = spawn(_wait_quiet, 2, env={"UNISON_TIMEOUT": "30"})
    assert outs[0] == [True, [3.0, 3.0, 3.0]]
    assert outs[1] == [False, True, [0, 1, 2, 3, 4], True, True, [3.0, 3.0, 3.0]]
