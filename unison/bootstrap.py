"""Bootstrap: publish this rank's address through the store, connect every pair.

Control plane only: the store carries each rank's :class:`PeerInfo` once; after
that, all data moves over the authenticated peer connections. Rank ``i`` connects
to every lower rank and accepts from every higher one; the listener is closed as
soon as the mesh is complete, so no port stays open for the rest of the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from .errors import (
    AbortedError,
    AuthenticationError,
    CollectiveTimeoutError,
    InvalidArgumentError,
    StoreTimeoutError,
)
from .log import get_logger
from .store import Store
from .transport.base import PeerInfo
from .transport.handshake import (
    accept_handshake,
    connect_handshake,
    finish_handshake,
    job_digest,
    send_hello,
)

__all__ = ["CANCEL_KEY", "advertise_address", "connect_mesh", "connect_peers", "host_identity"]

log = get_logger("bootstrap")
#: unfinished handshakes on the peer port at once; further connections are closed
MAX_PENDING_HANDSHAKES = 32
#: whoever runs the job (an elastic driver) sets this key to cancel a rendezvous that
#: cannot complete (a member died before it joined); waiting ranks then fail at once
#: with :class:`~unison.errors.AbortedError` carrying the key's text, not at the deadline
CANCEL_KEY = "unison/{epoch}/cancel"
#: seconds between looks at the cancel key while a rendezvous waits for a peer
CANCEL_POLL = 0.25


def host_identity() -> str:
    """Ranks with equal identity share memory: hostname plus network namespace."""
    override = os.environ.get("UNISON_HOST_ID")
    if override:
        return override
    try:
        ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}/{ns}"


def _interface_address(name: str) -> str:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    except OSError as exc:
        raise InvalidArgumentError(f"network interface {name!r}: {exc}") from None
    finally:
        sock.close()
    return socket.inet_ntoa(packed[20:24])


def advertise_address(store_host: str | None, interface: str = "") -> str:
    """The address other ranks should connect to."""
    if interface:
        return _interface_address(interface)
    if store_host is None or store_host.startswith("127.") or store_host == "localhost":
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((store_host, 9))  # no packet is sent: this only picks a route
        return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        probe.close()


def _connect(
    info: PeerInfo,
    secret: bytes,
    job: bytes,
    rank: int,
    deadline: float,
    cancelled: Callable[[], None],
) -> socket.socket:
    """Connect and authenticate to ``info``'s listener, retrying while it is busy (e.g.
    strangers hold its handshake slots) until the deadline."""
    pause = 0.05
    while True:
        sock = None
        try:
            sock = socket.create_connection((info.addr, info.port), timeout=10)
            connect_handshake(
                sock, secret, job, rank, info.rank, min(deadline, time.monotonic() + 10)
            )
            return sock
        except AuthenticationError:
            if sock is not None:
                sock.close()
            raise
        except (OSError, struct.error) as exc:
            if sock is not None:
                sock.close()
            if time.monotonic() + pause >= deadline:
                raise CollectiveTimeoutError(
                    f"init: could not connect to rank {info.rank} at {info.addr}:{info.port}: "
                    f"{exc}",
                    op="init",
                    ranks=[info.rank],
                ) from None
            cancelled()
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def connect_peers(
    infos: dict[int, PeerInfo],
    peers: list[int],
    secret: bytes,
    job: bytes,
    rank: int,
    deadline: float,
    cancelled: Callable[[], None],
) -> dict[int, socket.socket]:
    """Connect and authenticate to every one of ``peers``: hello to all of them first,
    then each handshake finished in turn, so the peers compute their answers at once
    instead of one after another; a peer whose first try failed (its listener busy) is
    retried as :func:`_connect` retries."""
    started: dict[int, tuple[socket.socket, bytes]] = {}
    done: dict[int, socket.socket] = {}
    try:
        for peer in peers:
            sock = None
            try:
                sock = socket.create_connection((infos[peer].addr, infos[peer].port), timeout=10)
                started[peer] = (sock, send_hello(sock, job, rank))
            except OSError:
                if sock is not None:
                    sock.close()
        for peer in peers:
            first = started.pop(peer, None)
            if first is not None:
                sock, nonce = first
                try:
                    limit = min(deadline, time.monotonic() + 10)
                    finish_handshake(sock, secret, job, rank, peer, nonce, limit)
                    done[peer] = sock
                    continue
                except AuthenticationError:
                    sock.close()
                    raise
                except (OSError, struct.error):
                    sock.close()
            done[peer] = _connect(infos[peer], secret, job, rank, deadline, cancelled)
    except BaseException:
        for sock, _ in started.values():
            sock.close()
        for sock in done.values():
            sock.close()
        raise
    return done


def connect_mesh(
    store: Store,
    rank: int,
    size: int,
    secret: bytes,
    job_id: str,
    *,
    advertise: str,
    bind: str,
    timeout: float,
    epoch: int,
    adopt: Callable[[int, socket.socket], None],
) -> dict[int, PeerInfo]:
    """Connect to every peer; ``adopt(peer, sock)`` receives each authenticated socket."""
    deadline = time.monotonic() + timeout
    job = job_digest(job_id)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind or ("127.0.0.1" if advertise.startswith("127.") else "0.0.0.0"), 0))
    listener.listen(max(16, size))
    listener.settimeout(0.5)
    me = PeerInfo(rank, host_identity(), advertise, listener.getsockname()[1], os.getpid())
    prefix = f"unison/{epoch}/peer/"
    store.set(f"{prefix}{rank}", json.dumps(asdict(me)).encode())
    cancel = CANCEL_KEY.format(epoch=epoch)

    def cancelled() -> None:
        if store.check([cancel]):
            why = store.get(cancel, timeout=5.0).decode(errors="replace")
            raise AbortedError(f"init: rank {rank}: the rendezvous was cancelled: {why}", op="init")

    expected = set(range(rank + 1, size))
    accepted: dict[int, socket.socket] = {}
    cond = threading.Condition()
    errors: list[str] = []

    def handshake(sock: socket.socket) -> None:
        try:
            peer = accept_handshake(
                sock, secret, job, rank, size, min(deadline, time.monotonic() + 5)
            )
        except (OSError, AuthenticationError, struct.error) as exc:
            stranger(f"failed the handshake: {exc}")
            sock.close()
            return
        with cond:
            if peer not in expected or peer in accepted:
                errors.append(f"unexpected or duplicate connection from rank {peer}")
                sock.close()
                return
            accepted[peer] = sock
            cond.notify_all()

    slots = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
    strangers = [0]

    def stranger(why: str) -> None:
        """A connection refused before it authenticated: said once at INFO, then counted."""
        with cond:
            strangers[0] += 1
            first = strangers[0] == 1
        if first:
            log.info(
                "rank %d: refused a connection to the peer port (%s); further ones are "
                "counted, logged at DEBUG",
                rank,
                why,
            )
        else:
            log.debug("rank %d: refused a connection to the peer port: %s", rank, why)

    def guarded(sock: socket.socket) -> None:
        try:
            handshake(sock)
        finally:
            slots.release()

    def accept_loop() -> None:
        while time.monotonic() < deadline:
            with cond:
                if len(accepted) == len(expected):
                    return
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not slots.acquire(blocking=False):
                # Too many unfinished handshakes (a flood): refuse rather than grow threads.
                stranger("too many pending handshakes")
                sock.close()
                continue
            threading.Thread(target=guarded, args=(sock,), daemon=True).start()

    acceptor: threading.Thread | None = None
    if expected:  # the last rank accepts nothing (starting a thread costs a scheduling round trip)
        acceptor = threading.Thread(target=accept_loop, name="unison-accept", daemon=True)
        acceptor.start()
    try:
        infos: dict[int, PeerInfo] = {rank: me}
        for peer in range(size):
            if peer == rank:
                continue
            key = f"{prefix}{peer}"
            while True:  # a get waits for the key: one request per peer that has joined
                left = deadline - time.monotonic()
                try:
                    raw = store.get(key, timeout=max(min(left, CANCEL_POLL), 0.001))
                    break
                except StoreTimeoutError:
                    cancelled()
                    if left <= CANCEL_POLL:
                        raise CollectiveTimeoutError(
                            f"init: rank {peer} did not join within {timeout:.0f}s",
                            op="init",
                            ranks=[peer],
                        ) from None
            infos[peer] = PeerInfo(**json.loads(raw))
        lower = connect_peers(infos, list(range(rank)), secret, job, rank, deadline, cancelled)
        for peer, sock in lower.items():
            adopt(peer, sock)
        while True:
            with cond:
                if len(accepted) == len(expected):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(expected - set(accepted))
                    raise CollectiveTimeoutError(
                        f"init: ranks {missing} did not connect within {timeout:.0f}s"
                        + (f" ({'; '.join(errors)})" if errors else ""),
                        op="init",
                        ranks=missing,
                    )
                cond.wait(min(left, CANCEL_POLL))
                if len(accepted) == len(expected):
                    break
            cancelled()
        for peer, sock in sorted(accepted.items()):
            adopt(peer, sock)
        return infos
    finally:
        # shutdown() wakes the acceptor blocked in accept() at once (close() alone does
        # not: the rendezvous would wait out the accept timeout, 0.5 s, every init)
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        if acceptor is not None:
            acceptor.join(timeout=2)
        if strangers[0] > 1:
            log.info("rank %d: refused %d connections to the peer port", rank, strangers[0])
