"""Wire format of the TCP store: authenticated frames around a tiny binary body.

Connection set-up: on accept the server sends ``HELLO_MAGIC`` followed by a fresh
32-byte random nonce. After that, every frame in either direction is::

    [u32 body length][32-byte MAC][body]

    MAC = HMAC-SHA256(secret, direction || nonce || u64 counter || body)

``direction`` is ``b"unison-c2s"`` for requests and ``b"unison-s2c"`` for responses;
``counter`` counts the frames already sent in that direction on this connection
(it is never transmitted, both ends keep it). So a frame copied from another
connection (other nonce), from another job (other secret), replayed on the same
connection (stale counter) or reflected back (other direction) fails the MAC.

A body is ``[u8 code][u32 n][n x ([u32 length][bytes])]``: an op code (requests)
or a status (responses), then length-prefixed fields. Integers and floats travel as
8-byte big-endian fields. Nothing is ever unpickled.

Frames longer than :data:`MAX_FRAME` are refused from the 4-byte header, before
anything is allocated for them.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import struct
from collections.abc import Sequence

__all__ = [
    "HEADER",
    "HELLO",
    "HELLO_MAGIC",
    "MAC_LEN",
    "MAX_FIELDS",
    "MAX_FRAME",
    "NONCE_LEN",
    "REJECT",
    "StoreOp",
    "ProtocolError",
    "StoreStatus",
    "decode_body",
    "encode_body",
    "f64",
    "i64",
    "mac",
    "parse_f64",
    "parse_i64",
    "parse_key",
    "verify",
]

MAX_FRAME = 16 << 20  # largest body accepted, in bytes
MAC_LEN = 32
NONCE_LEN = 32
HEADER = struct.Struct("!I")
HELLO_MAGIC = b"UNISONS1"
HELLO = len(HELLO_MAGIC) + NONCE_LEN
MAX_FIELDS = 1 << 16
REJECT = b"\xff\xff\xff\xff"  # sent (unauthenticated) before closing on a bad MAC

C2S = b"unison-c2s"
S2C = b"unison-s2c"

_U8 = struct.Struct("!B")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")


class ProtocolError(ValueError):
    """A frame or body that does not follow the wire format."""


class StoreOp(enum.IntEnum):
    PING = 1
    SET = 2
    GET = 3  # key, f64 timeout
    ADD = 4  # key, i64 amount
    CAS = 5  # key, expected, desired
    WAIT = 6  # f64 timeout, keys...
    CHECK = 7  # keys...
    DELETE = 8  # key
    NUM_KEYS = 9


class StoreStatus(enum.IntEnum):
    OK = 0
    TIMEOUT = 1  # fields: the keys still missing
    ERROR = 2  # field: message


def mac(secret: bytes, direction: bytes, nonce: bytes, counter: int, body: bytes) -> bytes:
    h = hmac.new(secret, direction, hashlib.sha256)
    h.update(nonce)
    h.update(_U64.pack(counter))
    h.update(body)
    return h.digest()


def verify(
    secret: bytes, direction: bytes, nonce: bytes, counter: int, body: bytes, tag: bytes
) -> bool:
    return hmac.compare_digest(mac(secret, direction, nonce, counter, body), tag)


def encode_body(code: int, fields: Sequence[bytes]) -> bytes:
    if not 0 <= code <= 255:
        raise ProtocolError(f"code {code} does not fit in a byte")
    if len(fields) > MAX_FIELDS:
        raise ProtocolError(f"{len(fields)} fields (at most {MAX_FIELDS})")
    parts = [_U8.pack(code), _U32.pack(len(fields))]
    for field in fields:
        parts.append(_U32.pack(len(field)))
        parts.append(bytes(field))
    body = b"".join(parts)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"body of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return body


def decode_body(body: bytes) -> tuple[int, list[bytes]]:
    """Split a body into (code, fields); raises :class:`ProtocolError` and nothing else."""
    if len(body) < 5:
        raise ProtocolError("body shorter than its 5-byte head")
    code = body[0]
    (count,) = _U32.unpack_from(body, 1)
    if count > MAX_FIELDS:
        raise ProtocolError(f"{count} fields announced (at most {MAX_FIELDS})")
    fields: list[bytes] = []
    pos = 5
    end = len(body)
    for _ in range(count):
        if pos + 4 > end:
            raise ProtocolError("truncated field length")
        (n,) = _U32.unpack_from(body, pos)
        pos += 4
        if n > end - pos:
            raise ProtocolError("field runs past the end of the body")
        fields.append(bytes(body[pos : pos + n]))
        pos += n
    if pos != end:
        raise ProtocolError(f"{end - pos} trailing bytes after the last field")
    return code, fields


def i64(value: int) -> bytes:
    return _I64.pack(value)


def f64(value: float) -> bytes:
    return _F64.pack(value)


def parse_i64(field: bytes) -> int:
    if len(field) != 8:
        raise ProtocolError("integer field is not 8 bytes")
    return int(_I64.unpack(field)[0])


def parse_f64(field: bytes) -> float:
    if len(field) != 8:
        raise ProtocolError("float field is not 8 bytes")
    value = float(_F64.unpack(field)[0])
    if math.isnan(value):
        raise ProtocolError("float field is NaN")
    return value


def parse_key(field: bytes) -> str:
    try:
        return field.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("key is not valid UTF-8") from None
