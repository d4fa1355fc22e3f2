"""The TCP store under real sockets: authentication, hostile peers, concurrency."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from unison.errors import AuthenticationError, StoreError, StoreTimeoutError
from unison.store import TCPStore, TCPStoreServer
from unison.store import protocol as p

pytestmark = pytest.mark.timeout(30)

SECRET = b"s3cret-for-tests"
FRAME_TIMEOUT = 1.0


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def server_threads(server: TCPStoreServer) -> int:
    name = f"unison-store-server:{server.address[1]}"
    return sum(1 for t in threading.enumerate() if t.name == name)


class Raw:
    """A hand-driven client: reads the greeting, builds frames with any secret/counter."""

    def __init__(self, server: TCPStoreServer) -> None:
        self.sock = socket.create_connection(server.address, timeout=5)
        hello = self.recv_exact(p.HELLO)
        assert hello.startswith(p.HELLO_MAGIC)
        self.nonce = hello[len(p.HELLO_MAGIC) :]

    def recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def frame(self, body: bytes, counter: int = 0, secret: bytes = SECRET) -> bytes:
        tag = p.mac(secret, p.C2S, self.nonce, counter, body)
        return p.HEADER.pack(len(body)) + tag + body

    def closed_by_server(self, timeout: float = 4.0) -> bytes:
        """Read until EOF; returns what came before it. Fails if the server keeps it open."""
        self.sock.settimeout(timeout)
        got = b""
        while True:
            try:
                chunk = self.sock.recv(4096)
            except ConnectionResetError:  # closed with our unread bytes in its buffer
                return got
            if not chunk:
                return got
            got += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer(secret=SECRET, frame_timeout=FRAME_TIMEOUT, max_connections=50).start()
    yield srv
    srv.close()


def assert_healthy(server: TCPStoreServer, baseline_fds: int | None = None) -> None:
    with TCPStore(*server.address, SECRET, timeout=5) as c:
        c.set("health", b"ok")
        assert c.get("health") == b"ok"
        before = c.add("health-n", 0)
        assert c.add("health-n", 2) == before + 2
    assert server_threads(server) == 1
    if baseline_fds is not None:
        assert wait_until(lambda: server.num_connections() == 0)
        assert wait_until(lambda: fd_count() <= baseline_fds), (fd_count(), baseline_fds)


@pytest.fixture
def baseline(server: TCPStoreServer) -> int:
    assert_healthy(server)
    assert wait_until(lambda: server.num_connections() == 0)
    return fd_count()


def test_wrong_secret_raises_authentication_error(
    server: TCPStoreServer, baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = server.address
    with caplog.at_level(logging.INFO, logger="unison.store"):
        with pytest.raises(AuthenticationError, match=f"{host}:{port} rejected our job secret"):
            TCPStore(host, port, b"another job's secret", timeout=5)
    assert any(
        "did not authenticate" in r.getMessage() and "wrong job secret" in r.getMessage()
        for r in caplog.records
    )
    assert server.num_strangers() == 1
    assert_healthy(server, baseline)


def test_unverified_client_fails_its_first_request_on_a_wrong_secret(
    server: TCPStoreServer, baseline: int
) -> None:
    """verify=False spares the ping: the first request proves the secret, and a wrong one
    fails it with the same error the ping gives; a right one works as usual."""
    host, port = server.address
    stranger = TCPStore(host, port, b"another job's secret", timeout=5, verify=False)
    try:
        with pytest.raises(AuthenticationError, match=f"{host}:{port} rejected our job secret"):
            stranger.add("unverified", 1)
        with pytest.raises(StoreError, match="unusable"):
            stranger.get("unverified", timeout=1)
    finally:
        stranger.close()
    member = TCPStore(host, port, SECRET, timeout=5, verify=False)
    try:
        assert member.add("unverified", 2) == 2
        assert member.get("unverified") == b"2"
    finally:
        member.close()
    assert server.num_strangers() == 1
    assert_healthy(server, baseline)


def test_strangers_counted_not_logged_one_by_one(
    server: TCPStoreServer, baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood of strangers (wrong secret, junk, huge headers) writes one line, not one each."""
    with caplog.at_level(logging.INFO, logger="unison.store"):
        for i in range(30):
            raw = Raw(server)
            if i % 3 == 0:
                raw.sock.sendall(raw.frame(p.encode_body(p.StoreOp.PING, []), secret=b"guess"))
            elif i % 3 == 1:
                raw.sock.sendall(p.HEADER.pack(p.MAX_FRAME))
            else:
                raw.sock.sendall(b"GET / HTTP/1.0\r\n\r\n" * 8)
            raw.closed_by_server()
            raw.close()
        assert wait_until(lambda: server.num_strangers() == 30)
    lines = [r for r in caplog.records if r.name.startswith("unison.store")]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in lines]
    assert_healthy(server, baseline)


_RSS_SERVER = """
import sys
from unison.store import TCPStoreServer
srv = TCPStoreServer(secret=b"s3cret", frame_timeout=30.0).start()
print(srv.address[1], flush=True)
sys.stdin.read()
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_strangers_announcing_huge_frames_hold_a_few_kib_each() -> None:
    """48 strangers each announce a frame just under the limit and send 2 MiB of it: the
    server must not buffer any of it before the first frame authenticates (it did: 16 MiB
    a connection, ~100 MB here)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _RSS_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.3)
        before = _rss_kib(proc.pid)
        junk = b"\0" * (256 << 10)
        for _ in range(48):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(s)
            s.recv(p.HELLO)
            try:
                s.sendall(p.HEADER.pack(p.MAX_FRAME - 1))
                for _ in range(8):  # 2 MiB of the announced body
                    s.sendall(junk)
            except OSError:
                pass  # the server closed it: what a stranger should get
        time.sleep(0.5)
        grown = _rss_kib(proc.pid) - before
        assert grown < 8 << 10, f"the store grew {grown} KiB holding 48 strangers' bytes"
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()


def test_random_bytes_close_connection(server: TCPStoreServer, baseline: int) -> None:
    for seed in range(3):
        raw = Raw(server)
        raw.sock.sendall(bytes((seed * 97 + i * 31) % 256 for i in range(5000)))
        raw.closed_by_server()
        raw.close()
    assert_healthy(server, baseline)


def test_oversized_header_refused_at_once(server: TCPStoreServer, baseline: int) -> None:
    raw = Raw(server)
    t0 = time.monotonic()
    raw.sock.sendall(p.HEADER.pack(2**31))
    assert raw.closed_by_server() == b""
    assert time.monotonic() - t0 < FRAME_TIMEOUT  # not the slowloris timer: the header check
    raw.close()
    assert_healthy(server, baseline)


def test_truncated_frame_dropped(server: TCPStoreServer, baseline: int) -> None:
    raw = Raw(server)
    frame = raw.frame(p.encode_body(p.StoreOp.SET, [b"k", b"v" * 100]))
    raw.sock.sendall(frame[:60])
    t0 = time.monotonic()
    assert raw.closed_by_server() == b""
    assert FRAME_TIMEOUT * 0.8 <= time.monotonic() - t0 < FRAME_TIMEOUT + 2.0
    raw.close()
    assert server.get_local("k") is None
    assert_healthy(server, baseline)


def test_wrong_mac_rejected(server: TCPStoreServer, baseline: int) -> None:
    raw = Raw(server)
    raw.sock.sendall(raw.frame(p.encode_body(p.StoreOp.SET, [b"evil", b"1"]), secret=b"guess"))
    assert raw.closed_by_server() == p.REJECT
    raw.close()
    assert server.get_local("evil") is None
    assert_healthy(server, baseline)


def test_replays_rejected(server: TCPStoreServer, baseline: int) -> None:
    a = Raw(server)
    frame = a.frame(p.encode_body(p.StoreOp.ADD, [b"ctr", p.i64(1)]))
    a.sock.sendall(frame)
    head = a.recv_exact(p.HEADER.size)
    (length,) = p.HEADER.unpack(head)
    a.recv_exact(p.MAC_LEN + length)
    assert server.get_local("ctr") == b"1"
    # the same frame on another connection (other nonce) ...
    b = Raw(server)
    b.sock.sendall(frame)
    assert b.closed_by_server() == p.REJECT
    # ... and again on its own connection (stale counter)
    a.sock.sendall(frame)
    assert a.closed_by_server() == p.REJECT
    a.close()
    b.close()
    assert server.get_local("ctr") == b"1"
    assert_healthy(server, baseline)


@pytest.mark.parametrize("authenticated", [False, True])
def test_one_byte_per_interval_client_dropped(
    server: TCPStoreServer, baseline: int, authenticated: bool
) -> None:
    raw = Raw(server)
    counter = 0
    if authenticated:  # a valid ping first: the slow frame then comes from a known peer
        raw.sock.sendall(raw.frame(p.encode_body(p.StoreOp.PING, []), 0))
        (length,) = p.HEADER.unpack(raw.recv_exact(p.HEADER.size))
        raw.recv_exact(p.MAC_LEN + length)
        counter = 1
    frame = raw.frame(p.encode_body(p.StoreOp.SET, [b"slow", b"x" * 20]), counter)
    t0 = time.monotonic()
    dropped = False
    for byte in frame:
        try:
            raw.sock.sendall(bytes([byte]))
        except OSError:
            dropped = True
            break
        raw.sock.settimeout(0.3)
        try:
            if raw.sock.recv(1) == b"":
                dropped = True
                break
        except TimeoutError:
            pass
        if time.monotonic() - t0 > FRAME_TIMEOUT + 3:
            break
    assert dropped
    raw.close()
    assert server.get_local("slow") is None
    assert_healthy(server, baseline)


def test_idle_unauthenticated_connection_dropped(server: TCPStoreServer, baseline: int) -> None:
    raw = Raw(server)
    assert raw.closed_by_server() == b""
    raw.close()
    assert_healthy(server, baseline)


def test_two_hundred_connections(server: TCPStoreServer, baseline: int) -> None:
    socks = []
    for _ in range(200):
        s = socket.socket()
        s.settimeout(5)
        s.connect(server.address)
        socks.append(s)
    assert wait_until(lambda: server.num_connections() >= 40)
    assert server.num_connections() <= 50
    assert_healthy(server)  # a legitimate client still gets in, evicting a stranger
    for s in socks:
        s.close()
    assert_healthy(server, baseline)


def test_pipelined_request_while_parked_is_dropped(server: TCPStoreServer, baseline: int) -> None:
    raw = Raw(server)
    raw.sock.sendall(raw.frame(p.encode_body(p.StoreOp.GET, [b"later", p.f64(10)]), 0))
    time.sleep(0.1)
    raw.sock.sendall(raw.frame(p.encode_body(p.StoreOp.PING, []), 1))
    assert raw.closed_by_server() == b""
    raw.close()
    assert_healthy(server, baseline)


def test_parked_client_disconnect_cleans_up(server: TCPStoreServer, baseline: int) -> None:
    c = TCPStore(*server.address, SECRET, timeout=5)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            c.get("never", 10)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    assert wait_until(lambda: server.num_parked() == 1)
    c.close()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert_healthy(server, baseline)
    assert server.num_parked() == 0  # no parked request left behind


def test_server_close_releases_parked_get() -> None:
    srv = TCPStoreServer(secret=SECRET).start()
    c = TCPStore(*srv.address, SECRET, timeout=30)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            c.get("never", timeout=30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    srv.close()
    t.join(5)
    assert time.monotonic() - t0 < 3
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert not isinstance(errors[0], StoreTimeoutError)
    c.close()


def test_client_waits_for_late_server() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    holder: list[TCPStoreServer] = []
    timer = threading.Timer(
        0.4, lambda: holder.append(TCPStoreServer(port=port, secret=SECRET).start())
    )
    timer.start()
    try:
        with TCPStore("127.0.0.1", port, SECRET, timeout=10) as c:
            c.set("k", b"v")
            assert holder[0].get_local("k") == b"v"
    finally:
        timer.join()
        for s in holder:
            s.close()


def test_connect_timeout_when_nobody_listens() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    t0 = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, SECRET, timeout=0.5)
    assert time.monotonic() - t0 < 3


def _fake_server(reply: Callable[[socket.socket, bytes], None]) -> tuple[int, threading.Thread]:
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]

    def run() -> None:
        conn, _ = lst.accept()
        nonce = b"N" * p.NONCE_LEN
        conn.sendall(p.HELLO_MAGIC + nonce)
        reply(conn, nonce)
        time.sleep(0.2)
        conn.close()
        lst.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t


def test_client_rejects_answers_it_cannot_authenticate() -> None:
    def forged(conn: socket.socket, nonce: bytes) -> None:
        conn.recv(4096)
        body = p.encode_body(p.StoreStatus.OK, [])
        tag = p.mac(b"impostor", p.S2C, nonce, 0, body)
        conn.sendall(p.HEADER.pack(len(body)) + tag + body)

    port, t = _fake_server(forged)
    with pytest.raises(AuthenticationError, match="failed authentication"):
        TCPStore("127.0.0.1", port, SECRET, timeout=5)
    t.join(5)


def test_client_rejects_non_unison_greeting() -> None:
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]

    def run() -> None:
        conn, _ = lst.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6 hello there, not a store\r\n")
        time.sleep(0.3)
        conn.close()
        lst.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    with pytest.raises(StoreError, match="not a unison store"):
        TCPStore("127.0.0.1", port, SECRET, timeout=5)
    t.join(5)


def test_many_processes_add_exact_total(server: TCPStoreServer) -> None:
    host, port = server.address
    code = (
        "import sys\n"
        "from unison.store import TCPStore\n"
        f"c = TCPStore({host!r}, {port}, {SECRET!r}, timeout=20)\n"
        "for _ in range(100):\n"
        "    c.add('total', 1)\n"
        "c.set('done/' + sys.argv[1], b'1')\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)]) for i in range(4)]
    for proc in procs:
        assert proc.wait(25) == 0
    with TCPStore(host, port, SECRET, timeout=5) as c:
        c.wait([f"done/{i}" for i in range(4)], timeout=5)
        assert c.add("total", 0) == 400
    assert server_threads(server) == 1


def test_get_local_and_oversized_value(server: TCPStoreServer) -> None:
    assert server.get_local("nothing") is None
    with TCPStore(*server.address, SECRET, timeout=5) as c:
        with pytest.raises(ValueError, match="too large"):
            c.set("big", bytes(p.MAX_FRAME))
        c.set("fine", b"1")  # the connection is still usable
        assert server.get_local("fine") == b"1"
        assert c.num_keys() >= 1
