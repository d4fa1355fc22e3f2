"""A single-producer/single-consumer byte ring in shared memory.

``head`` counts bytes ever written (only the producer stores it), ``tail`` bytes
ever consumed (only the consumer stores it); both are aligned 64-bit words on
their own cache lines, so each store is one instruction and x86's ordering of
stores makes the bytes before a published ``head`` visible with it. Frames are a
byte stream through the ring (a 48-byte unison header, then the payload), so a
message larger than the ring simply streams through it in pieces.
"""

from __future__ import annotations

import ctypes

from ..buffers.copy import copy_bytes
from .shm_segment import RING_CTL, Segment

__all__ = ["Ring"]


class Ring:
    """One direction of one pair: ``sender`` → the owner of ``seg``."""

    __slots__ = ("_head", "_tail", "cap", "data", "head", "tail")

    def __init__(self, seg: Segment, offset: int, cap: int) -> None:
        self._head: ctypes.c_uint64 = seg.u64(offset)
        self._tail: ctypes.c_uint64 = seg.u64(offset + 64)
        self.data = seg.view(offset + RING_CTL, cap)
        self.cap = cap
        # local copies: the producer's own head, the consumer's own tail
        self.head = self._head.value
        self.tail = self._tail.value

    # --- producer side ------------------------------------------------------------------
    def free(self) -> int:
        return self.cap - (self.head - self._tail.value)

    def put(self, src: memoryview, start: int, limit: int) -> int:
        """Copy up to ``limit`` bytes of ``src[start:]`` in; returns how many (unpublished)."""
        k = min(self.cap - (self.head - self._tail.value), limit)
        if k <= 0:
            return 0
        pos = self.head % self.cap
        first = min(k, self.cap - pos)
        copy_bytes(self.data[pos : pos + first], src[start : start + first])
        if k > first:
            copy_bytes(self.data[0 : k - first], src[start + first : start + k])
        self.head += k
        return k

    def publish(self) -> None:
        self._head.value = self.head

    # --- consumer side --------------------------------------------------------------------
    def available(self) -> int:
        return self._head.value - self.tail

    def get(self, dst: memoryview | None, start: int, k: int) -> None:
        """Consume ``k`` available bytes into ``dst[start:]`` (or drop them); unpublished."""
        if dst is not None:
            pos = self.tail % self.cap
            first = min(k, self.cap - pos)
            copy_bytes(dst[start : start + first], self.data[pos : pos + first])
            if k > first:
                copy_bytes(dst[start + first : start + k], self.data[0 : k - first])
        self.tail += k

    def peek(self, k: int) -> bytes:
        pos = self.tail % self.cap
        first = min(k, self.cap - pos)
        if first == k:
            return bytes(self.data[pos : pos + k])
        return bytes(self.data[pos : pos + first]) + bytes(self.data[0 : k - first])

    def release(self) -> None:
        self._tail.value = self.tail
