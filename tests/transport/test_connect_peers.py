"""connect_peers: a rank greets every lower peer before it finishes any handshake."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from unison.bootstrap import connect_peers
from unison.errors import AuthenticationError
from unison.transport.base import PeerInfo
from unison.transport.handshake import accept_handshake, job_digest

pytestmark = pytest.mark.timeout(30)

SECRET = b"k" * 32
JOB = job_digest("test-connect-peers")
HELLO_BYTES = 40  # the connector's first message


def _acceptors(n: int, together: bool) -> tuple[list[socket.socket], dict[int, object]]:
    """``n`` listeners whose handshakes start only once all ``n`` hellos arrived
    (``together``), else each at once; what each handshake gave, by listener."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    arrived = threading.Barrier(n, timeout=5)
    got: dict[int, object] = {}

    def accept(i: int) -> None:
        conn, _ = listeners[i].accept()
        try:
            conn.recv(HELLO_BYTES, socket.MSG_PEEK | socket.MSG_WAITALL)
            if together:
                arrived.wait()
            got[i] = accept_handshake(conn, SECRET, JOB, i, n + 1, time.monotonic() + 5)
        except (threading.BrokenBarrierError, OSError, AuthenticationError) as exc:
            got[i] = exc
        finally:
            conn.close()

    for i in range(n):
        threading.Thread(target=accept, args=(i,), daemon=True).start()
    return listeners, got


def _infos(listeners: list[socket.socket]) -> dict[int, PeerInfo]:
    return {
        i: PeerInfo(i, "this-host", "127.0.0.1", s.getsockname()[1], 0)
        for i, s in enumerate(listeners)
    }


def test_every_peer_is_greeted_before_any_handshake_finishes() -> None:
    """Three peers that answer only once all three hellos are in: a connector that
    finished one handshake before greeting the next would wait until their 5 s."""
    listeners, got = _acceptors(3, together=True)
    t0 = time.monotonic()
    socks = connect_peers(
        _infos(listeners), [0, 1, 2], SECRET, JOB, 3, time.monotonic() + 20, lambda: None
    )
    assert sorted(socks) == [0, 1, 2]
    assert time.monotonic() - t0 < 4
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == {0: 3, 1: 3, 2: 3}
    for s in [*socks.values(), *listeners]:
        s.close()


def test_a_wrong_secret_fails_the_connection() -> None:
    listeners, _ = _acceptors(2, together=False)
    with pytest.raises(AuthenticationError, match="failed the job-secret check"):
        connect_peers(
            _infos(listeners), [0, 1], b"w" * 32, JOB, 2, time.monotonic() + 20, lambda: None
        )
    for s in listeners:
        s.close()
