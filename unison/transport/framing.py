"""The fixed frame header every transport puts before a message.

Layout (little-endian, 48 bytes)::

    magic u16 | version u8 | kind u8 | op u8 | dtype u8 | redop u8 | flags u8
    group u32 | tag u32 | seq u64 | root i32 | reserved u32 | count u64 | length u64

``kind`` says what the frame is (point-to-point data, collective data, control).
``op``, ``dtype``, ``redop``, ``root`` and ``count`` describe the *operation* the
sender is executing, so a receiver can tell a mismatched call (different
collective, dtype, element count, reduce op or root) from the message alone.
``length`` is the payload size in bytes that follows the header.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from .._types import OpSig

__all__ = ["HEADER", "MAGIC", "Frame", "FrameKind", "pack", "unpack"]

MAGIC = 0x554E  # "UN"
VERSION = 1
HEADER = struct.Struct("<HBBBBBBIIQiIQQ")
#: Largest payload a frame may announce (refused before anything is allocated).
MAX_PAYLOAD = 1 << 40


class FrameKind(enum.IntEnum):
    P2P = 1
    COLL = 2
    CONTROL = 3


class Control(enum.IntEnum):
    """Control frames: carried in ``tag`` of a CONTROL frame."""

    GOODBYE = 1  # orderly shutdown: not a failure
    ABORT = 2  # payload: utf-8 JSON describing why an operation failed


class Frame(NamedTuple):
    kind: FrameKind
    group: int
    seq: int
    tag: int
    sig: OpSig
    length: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (int(self.kind), self.group, self.seq, self.tag)


class FrameError(ValueError):
    """A header that is not a unison frame (bad magic, version or length)."""


def pack(kind: int, group: int, seq: int, tag: int, sig: OpSig, length: int) -> bytes:
    return HEADER.pack(
        MAGIC,
        VERSION,
        kind,
        sig.op,
        sig.dtype,
        sig.redop,
        0,
        group,
        tag,
        seq,
        sig.root,
        0,
        sig.count,
        length,
    )


def unpack(data: bytes | bytearray | memoryview) -> Frame:
    """Parse a header; raises :class:`FrameError` for anything malformed."""
    if len(data) != HEADER.size:
        raise FrameError(f"header must be {HEADER.size} bytes, got {len(data)}")
    (magic, version, kind, op, dtype, redop, _flags, group, tag, seq, root, _r, count, length) = (
        HEADER.unpack(data)
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic 0x{magic:04x}")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version}")
    try:
        k = FrameKind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    if length > MAX_PAYLOAD:
        raise FrameError(f"frame announces {length} bytes, above the {MAX_PAYLOAD} limit")
    return Frame(k, group, seq, tag, OpSig(op, dtype, redop, root, count), length)
