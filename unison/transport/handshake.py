"""Mutual challenge-response on every peer connection, keyed by the job secret.

connector -> acceptor : b"UNH1" | job digest (16) | connector rank u32 | nonce_c (16)
acceptor -> connector : acceptor rank u32 | nonce_a (16) | HMAC(secret, "acc" ...)
connector -> acceptor : HMAC(secret, "con" ...)

Both MACs cover both fresh nonces, both ranks and the job, so a frame recorded
from another connection or another job never verifies. Every message has a fixed
size: nothing is allocated from what an unauthenticated peer says.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import time

from ..errors import AuthenticationError

__all__ = [
    "accept_handshake",
    "connect_handshake",
    "finish_handshake",
    "job_digest",
    "send_hello",
]

_MAGIC = b"UNH1"
_HELLO = struct.Struct("<4s16sI16s")
_REPLY = struct.Struct("<I16s32s")
_PROOF = 32


def job_digest(job_id: str) -> bytes:
    return hashlib.sha256(job_id.encode()).digest()[:16]


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("handshake timed out")
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            continue
        if not chunk:
            raise ConnectionError("peer closed during handshake")
        buf += chunk
    return bytes(buf)


def connect_handshake(
    sock: socket.socket,
    secret: bytes,
    job: bytes,
    my_rank: int,
    peer_rank: int,
    deadline: float,
) -> None:
    nonce_c = send_hello(sock, job, my_rank)
    finish_handshake(sock, secret, job, my_rank, peer_rank, nonce_c, deadline)


def send_hello(sock: socket.socket, job: bytes, my_rank: int) -> bytes:
    """The connector's first message (its fresh nonce returned): a connector with several
    peers says hello to all of them before it finishes any (:func:`finish_handshake`),
    so their answers are computed at once instead of one after another."""
    nonce_c = secrets.token_bytes(16)
    sock.sendall(_HELLO.pack(_MAGIC, job, my_rank, nonce_c))
    return nonce_c


def finish_handshake(
    sock: socket.socket,
    secret: bytes,
    job: bytes,
    my_rank: int,
    peer_rank: int,
    nonce_c: bytes,
    deadline: float,
) -> None:
    """The connector's part after :func:`send_hello`: check the acceptor's proof, send ours."""
    rank_a, nonce_a, mac_a = _REPLY.unpack(_recv_exact(sock, _REPLY.size, deadline))
    ranks = struct.pack("<II", rank_a, my_rank)
    expect = _mac(secret, b"acc", nonce_c, nonce_a, job, ranks)
    if not hmac.compare_digest(mac_a, expect):
        raise AuthenticationError(
            f"rank {peer_rank}'s listener failed the job-secret check (another job on that port?)"
        )
    if rank_a != peer_rank:
        raise AuthenticationError(f"expected rank {peer_rank} at that address, found rank {rank_a}")
    sock.sendall(_mac(secret, b"con", nonce_a, nonce_c, job, ranks))


def accept_handshake(
    sock: socket.socket, secret: bytes, job: bytes, my_rank: int, size: int, deadline: float
) -> int:
    """Authenticate an incoming connection; returns the connector's rank."""
    magic, their_job, rank_c, nonce_c = _HELLO.unpack(_recv_exact(sock, _HELLO.size, deadline))
    if magic != _MAGIC:
        raise AuthenticationError("not a unison peer (bad handshake magic)")
    if not hmac.compare_digest(their_job, job):
        raise AuthenticationError("peer belongs to another job")
    if not 0 <= rank_c < size or rank_c == my_rank:
        raise AuthenticationError(f"peer claims impossible rank {rank_c}")
    nonce_a = secrets.token_bytes(16)
    ranks = struct.pack("<II", my_rank, rank_c)
    sock.sendall(_REPLY.pack(my_rank, nonce_a, _mac(secret, b"acc", nonce_c, nonce_a, job, ranks)))
    proof = _recv_exact(sock, _PROOF, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"con", nonce_a, nonce_c, job, ranks)):
        raise AuthenticationError(f"connection claiming rank {rank_c} failed the job-secret check")
    return int(rank_c)
