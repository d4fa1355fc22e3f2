"""Two ranks' broadcasts by message, confirmed in batches (desync's third layer for a
group of two).

A broadcast's root only sends, so it learns that its receiver called the same
broadcast only from a confirmation. Per call, that is a message from the receiver
and a wait for it: on TCP, a message latency and a wake-up of the root's reader in
every broadcast, which a root in MPI or Gloo does not pay. Between two ranks the
receiver needs nothing from the root beyond the data (every data frame carries the
root's signature, and the receiver compares it on arrival), so the confirmation can
go one way and in batches:

- A *batch* is a run of consecutive broadcasts of the group with one root, each by
  message (no shared memory) and carrying data. Both ranks keep the same batch (the
  same calls in the same order, if they agree): its first sequence number, its
  calls, their bytes, and a hash chained over every call's sequence number and
  signature.
- The batch is *full* at :data:`AHEAD_CALLS` calls or :data:`AHEAD_BYTES` bytes. The
  receiver sends its *receipt* (first sequence number, number of calls, hash) as soon
  as the batch is full, or when its next call on the group does not continue the
  batch (another operation or another root), or at shutdown. The root receives it at
  the same points: before its next call when the batch is full or that call does not
  continue it, or at shutdown. So the root runs ahead of its receiver by at most a
  batch, and nobody waits for a message the other sends only later.
- The root keeps the batch's calls in flight until the receipt: another rank's abort
  or a frame of another operation for any of them (a receiver that believed itself
  the root sends its data to the root) still fails it, at its next call on the group.
  A receipt that differs from the root's batch is a mismatch.

Larger groups confirm every rooted call at once (:mod:`.desync`).
"""

from __future__ import annotations

import zlib

import numpy as np

from ..._types import OpSig
from ...algorithms import OpContext
from ...buffers import DType
from .desync import sig_hash

__all__ = ["AHEAD_BYTES", "AHEAD_CALLS", "RECEIPT_STEP", "Batch"]

#: the most broadcasts a root returns from before its receiver's receipt arrives: the
#: calls by which a disagreement can reach the root late
AHEAD_CALLS = 16
#: and the most bytes of them (a batch closes at the call that reaches it): what a
#: receiver that is behind may have to hold unasked meanwhile
AHEAD_BYTES = 4 << 20
#: the step of the receipt's message, on the confirmation context of the batch's last call
RECEIPT_STEP = 0


class Batch:
    """The open batch of a two-rank group, the same on both ranks if they agree."""

    def __init__(self) -> None:
        self.calls: list[OpContext] = []
        self._nbytes = 0
        self._hash = 0

    def __bool__(self) -> bool:
        return bool(self.calls)

    @property
    def root(self) -> int:
        """The batch's root (global rank; the signature names it)."""
        return self.calls[0].sig.root

    @property
    def full(self) -> bool:
        return len(self.calls) >= AHEAD_CALLS or self._nbytes >= AHEAD_BYTES

    def continued_by(self, sig: OpSig) -> bool:
        """Whether a batchable broadcast of signature ``sig`` joins this batch."""
        return not self.calls or (sig.root == self.root and not self.full)

    def add(self, ctx: OpContext) -> None:
        s = ctx.sig
        self.calls.append(ctx)
        self._nbytes += s.count * DType(s.dtype).itemsize
        raw = np.array([ctx.seq, sig_hash(s)], np.int64).tobytes()
        self._hash = zlib.crc32(raw, self._hash)

    def receipt(self) -> np.ndarray:
        """What the receiver sends and the root compares: first call, calls, hash."""
        return np.array([self.calls[0].seq, len(self.calls), self._hash], np.int64)

    def describe(self) -> str:
        first, last = self.calls[0].seq, self.calls[-1].seq
        return f"#{first}" if last == first else f"#{first} to #{last}"

    def close(self) -> list[OpContext]:
        """End the batch; its calls."""
        calls = self.calls
        self.calls, self._nbytes, self._hash = [], 0, 0
        return calls
