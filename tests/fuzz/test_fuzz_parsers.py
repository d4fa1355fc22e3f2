"""Fuzz targets for every parser that sees bytes from the network.

Under `make test` each runs a modest number of examples; `make fuzz` runs them with the
``fuzz`` hypothesis profile (many more examples, no deadline). Each target must either
parse or raise that parser's own error — never anything else, never hang, never
allocate from an unauthenticated length.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unison.errors import AuthenticationError
from unison.store import protocol as P
from unison.transport import framing as F
from unison.transport.handshake import accept_handshake, connect_handshake, job_digest

SECRET = b"s" * 32
JOB = job_digest("fuzz-job")


@given(st.binary(max_size=F.HEADER.size + 8))
def test_frame_header_parser(data: bytes) -> None:
    try:
        fr = F.unpack(data)
    except F.FrameError:
        return
    assert fr.length <= F.MAX_PAYLOAD


@given(st.binary(max_size=512))
def test_store_body_parser(data: bytes) -> None:
    try:
        code, fields = P.decode_body(data)
    except P.ProtocolError:
        return
    assert P.decode_body(P.encode_body(code, fields)) == (code, fields)


def _accept(data: bytes) -> BaseException | int:
    a, b = socket.socketpair()
    try:
        b.sendall(data)
        b.shutdown(socket.SHUT_WR)
        try:
            return accept_handshake(a, SECRET, JOB, 0, 4, time.monotonic() + 2)
        except (AuthenticationError, OSError, TimeoutError, struct.error) as exc:
            return exc
    finally:
        a.close()
        b.close()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=128))
def test_peer_handshake_rejects_random_bytes(data: bytes) -> None:
    assert not isinstance(_accept(data), int)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=30)
@given(
    rank=st.integers(0, 2**32 - 1),
    nonce=st.binary(min_size=16, max_size=16),
    proof=st.binary(min_size=32, max_size=32),
)
def test_peer_handshake_rejects_forged_hello_and_proof(
    rank: int, nonce: bytes, proof: bytes
) -> None:
    hello = struct.pack("<4s16sI16s", b"UNH1", JOB, rank, nonce)
    assert not isinstance(_accept(hello + proof), int)


def test_peer_handshake_accepts_the_real_thing() -> None:
    a, b = socket.socketpair()
    got: list[object] = []
    t = threading.Thread(
        target=lambda: got.append(accept_handshake(a, SECRET, JOB, 0, 4, time.monotonic() + 5))
    )
    t.start()
    connect_handshake(b, SECRET, JOB, 3, 0, time.monotonic() + 5)
    t.join(5)
    assert got == [3]
    a.close()
    b.close()


def test_peer_handshake_with_wrong_secret_fails_both_ways() -> None:
    a, b = socket.socketpair()
    got: list[object] = []

    def acc() -> None:
        try:
            got.append(accept_handshake(a, SECRET, JOB, 0, 4, time.monotonic() + 5))
        except (AuthenticationError, OSError) as exc:
            got.append(exc)

    t = threading.Thread(target=acc)
    t.start()
    try:
        connect_handshake(b, b"x" * 32, JOB, 3, 0, time.monotonic() + 5)
        raise AssertionError("a wrong secret was accepted")
    except AuthenticationError:
        pass
    b.close()
    t.join(5)
    a.close()
    assert got and not isinstance(got[0], int)
