"""The direct shared-memory algorithms' arena: every rank's slot, mapped in this process,
and the job-wide round counter (the planning of rounds is
:mod:`unison.algorithms.shm_arena`'s).

Each slot has two halves that alternate between rounds and, at its end, a few header
words a direct algorithm publishes besides data (its process id, a buffer's address,
flags).
"""

from __future__ import annotations

import numpy as np

__all__ = ["HEAD_BYTES", "Arena"]

#: bytes at the end of every slot for its header words (outside both halves)
HEAD_BYTES = 128


class Arena:
    """Every rank's slot, mapped here, and the job-wide round counter."""

    def __init__(self, rank: int, slots: dict[int, memoryview], slot_bytes: int) -> None:
        self.rank = rank
        self.half = ((slot_bytes - HEAD_BYTES) // 2) // 64 * 64
        self._slots = {r: np.frombuffer(mv, np.uint8) for r, mv in slots.items()}
        #: each slot's header words (int64, at its end): what a direct algorithm
        #: publishes besides data (its process id, a buffer's address, flags)
        self.heads = {
            r: a[slot_bytes - HEAD_BYTES : slot_bytes].view(np.int64)
            for r, a in self._slots.items()
        }
        #: whether every rank may read every other's memory directly (cross-memory
        #: attach), learnt on the first operation that asks; None: not yet known
        self.cma: bool | None = None
        self._round = 0

    @property
    def rounds_used(self) -> int:
        """Rounds taken so far (over the whole job, the same on every rank)."""
        return self._round

    def next_half(self) -> int:
        h = self._round % 2
        self._round += 1
        return h

    def typed(self, rank: int, half: int, count: int, dtype: np.dtype) -> np.ndarray:
        """``count`` elements of ``dtype`` at the start of ``rank``'s half ``half``."""
        off = half * self.half
        return self._slots[rank][off : off + count * dtype.itemsize].view(dtype)

    def elems(self, dtype: np.dtype) -> int:
        """Elements of ``dtype`` one half holds."""
        return self.half // dtype.itemsize

    def step(self, dtype: np.dtype, nbytes: int, total: int) -> int:
        """Elements of ``dtype`` per round for ``total`` bytes in rounds of at most
        ``nbytes`` (and at most a half): as many rounds as that needs, of equal length."""
        cap = max(1, min(self.half, nbytes) // dtype.itemsize)
        count = total // dtype.itemsize
        k = max(1, -(-count // cap))
        return max(1, -(-count // k))

    def release(self) -> None:
        self._slots.clear()
        self.heads.clear()
