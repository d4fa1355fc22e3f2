"""The TCP store's state machine on its own: parking, release, expiry, cancel (no I/O)."""

from __future__ import annotations

import pytest

from unison.store import protocol as p
from unison.store._kv import KVState, Parked

pytestmark = pytest.mark.timeout(10)


def test_get_parks_and_is_released_by_set() -> None:
    kv = KVState()
    parked = kv.request("conn-a", p.StoreOp.GET, [b"k", p.f64(5.0)], now=100.0)
    assert isinstance(parked, Parked) and kv.next_deadline() == 105.0
    assert kv.request("conn-b", p.StoreOp.SET, [b"k", b"v"], now=101.0) == (p.StoreStatus.OK, [])
    assert kv.take_completed() == [(parked, (p.StoreStatus.OK, [b"v"]))]
    assert kv.take_completed() == [] and kv.parked_count() == 0
    assert kv.next_deadline() is None


def test_wait_needs_every_key_and_expires_with_the_missing_ones() -> None:
    kv = KVState()
    w = kv.request("c", p.StoreOp.WAIT, [p.f64(2.0), b"a", b"b", b"c"], now=0.0)
    assert isinstance(w, Parked)
    kv.request("d", p.StoreOp.ADD, [b"a", p.i64(1)], now=0.5)
    kv.expire(1.9)
    assert kv.take_completed() == []
    kv.expire(2.0)
    assert kv.take_completed() == [(w, (p.StoreStatus.TIMEOUT, [b"b", b"c"]))]
    kv.request("d", p.StoreOp.SET, [b"b", b""], now=3.0)  # nobody is waiting any more
    assert kv.take_completed() == []


def test_cancel_forgets_the_waiter() -> None:
    kv = KVState()
    w = kv.request("c", p.StoreOp.GET, [b"k", p.f64(9.0)], now=0.0)
    assert isinstance(w, Parked)
    kv.cancel(w)
    kv.request("d", p.StoreOp.SET, [b"k", b"v"], now=1.0)
    kv.expire(100.0)
    assert kv.take_completed() == [] and kv.parked_count() == 0


def test_zero_timeout_answers_at_once_and_bad_requests_raise() -> None:
    kv = KVState()
    assert kv.request("c", p.StoreOp.GET, [b"k", p.f64(0.0)], 0.0) == (
        p.StoreStatus.TIMEOUT,
        [b"k"],
    )
    with pytest.raises(p.ProtocolError):
        kv.request("c", p.StoreOp.SET, [b"only-key"], 0.0)
    with pytest.raises(p.ProtocolError):
        kv.request("c", p.StoreOp.WAIT, [], 0.0)
    kv.request("c", p.StoreOp.SET, [b"n", str(2**63 - 1).encode()], 0.0)
    status, _ = kv.request("c", p.StoreOp.ADD, [b"n", p.i64(1)], 0.0)  # type: ignore[misc]
    assert status is p.StoreStatus.ERROR
