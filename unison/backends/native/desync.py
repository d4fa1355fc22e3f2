"""Desync detection: every rank must be running the same collective.

Three layers, cheapest first:

1. Every frame carries its sender's operation signature (op, dtype, count, reduce
   op, root); a receive whose frame disagrees fails with :class:`MismatchError`.
2. A frame that arrives for the operation in flight with a different signature,
   before anyone waits for it, fails that operation at once (no timeout wait).
3. Rooted collectives (broadcast, reduce, gather, scatter) let some ranks finish
   without hearing from every other rank — a broadcast root only sends. For them
   a *confirmation* follows: a recursive-doubling MAX over (hash, −hash) of the
   signature (log₂p tiny messages). Equal min and max mean all ranks agreed;
   otherwise every rank learns it at once and all-gathers the signatures to say
   who called what. Non-rooted collectives need no confirmation: each rank's
   result depends on checked frames from every other rank.

   The confirmation's first messages are sent *before* the data moves and carry the
   confirmed signature (:func:`check_sig`), and their receives are posted only after
   it: so they arrive unasked, and layer 2 compares them at once. Ranks that each
   believe they are the root of a gather or reduce (all waiting to receive) learn it
   from the first such message, instead of waiting out the deadline.

   A two-rank group's broadcasts by message are confirmed otherwise: one way, from
   receiver to root, in batches (:mod:`.receipts`), so that the root does not wait a
   message latency in every broadcast.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import numpy as np

from ..._types import OpCode, OpSig
from ...algorithms import OpContext, describe
from ...algorithms import all_gather_ring as ag
from ...algorithms import all_reduce_recursive_doubling as rd
from ...algorithms._schedule import recursive_doubling_plan
from ...errors import MismatchError
from ...transport.request import Request

__all__ = [
    "CONFIRM_EARLY_BY_MESSAGE",
    "CONFIRM_FIRST",
    "ROOTED",
    "Confirmation",
    "check_sig",
    "foreign_frame_error",
    "sig_hash",
]

ROOTED = frozenset({OpCode.BROADCAST, OpCode.REDUCE, OpCode.GATHER, OpCode.SCATTER})
#: rooted collectives whose ranks can all wait to receive when they disagree on the root
#: (each believing it is the root): their confirmation starts before the data moves
CONFIRM_FIRST = frozenset({OpCode.REDUCE, OpCode.GATHER})
#: rooted collectives whose confirmation also starts before the data moves when the data
#: goes by messages (no shared arena): the receivers' first confirmation messages then
#: travel while the data does, not after it, so the root waits one message latency less
CONFIRM_EARLY_BY_MESSAGE = frozenset({OpCode.BROADCAST})


def sig_hash(sig: OpSig) -> int:
    raw = np.array([sig.op, sig.dtype, sig.redop, sig.root, sig.count], np.int64).tobytes()
    return zlib.crc32(raw)


def check_sig(data: OpSig) -> OpSig:
    """The signature the confirmation's frames carry: CHECK, then the confirmed operation's
    dtype, reduce op, root and count (a frame carries no more than one signature)."""
    return OpSig(int(OpCode.CHECK), data.dtype, data.redop, data.root, data.count)


def _sig_of(row: np.ndarray) -> OpSig:
    return OpSig(int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))


class Confirmation:
    """The signature confirmation of one rooted collective, split in two so that its
    first exchange is posted before the data moves and overlaps it (with 2 ranks the
    whole confirmation does). The rest is recursive doubling of MAX over (h, -h)."""

    def __init__(self, data_ctx: OpContext, check: OpContext) -> None:
        self.data_ctx, self.check = data_ctx, check
        self.h = sig_hash(data_ctx.sig)
        self.vals = np.array([self.h, -self.h], np.int64)
        self.tmp = np.empty(2, np.int64)
        self.role, self.partner, self.peers = recursive_doubling_plan(check.rank, check.size)
        self.early: list[Request] = []
        self.first_done = self.started = False

    def start(self) -> None:
        """Send this rank's first message (before the data moves, for gather and reduce);
        its receives are posted in finish(), so the peers' first messages arrive unasked
        and are compared on arrival (desync layer 2)."""
        check, self.started = self.check, True
        if self.role == "fold":  # send my hash now; the result comes back at the end
            self.early = [check.isend(self.partner, 0, self.vals.copy())]
        elif self.peers and self.partner < 0:
            self.early = [check.isend(self.peers[0], 1, self.vals.copy())]
            self.first_done = True

    def drain(self) -> None:
        """After a started confirmation turned out unneeded (every pair of ranks compared
        signatures in the data exchange): take the peers' first messages, no more."""
        if self.role != "fold" and (self.partner >= 0 or self.first_done):
            src, tag = (self.partner, 0) if self.partner >= 0 else (self.peers[0], 1)
            self.early.append(self.check.irecv(src, tag, self.tmp))
        self.check.wait(*self.early)

    def _post_receives(self) -> None:
        check = self.check
        if self.role == "fold":
            self.early.append(check.irecv(self.partner, rd.RETURN_TAG, self.vals))
        elif self.partner >= 0:
            self.early.append(check.irecv(self.partner, 0, self.tmp))
        elif self.first_done:
            self.early.append(check.irecv(self.peers[0], 1, self.tmp))

    def finish(self) -> None:
        """Complete the exchange; raise MismatchError on every rank if ranks disagree."""
        if not self.started:
            self.start()
        check, vals, tmp = self.check, self.vals, self.tmp
        self._post_receives()
        try:
            check.wait(*self.early)
        except MismatchError as exc:  # a confirmation frame came in for a posted receive
            theirs = getattr(exc, "sender_sig", None)
            peer = exc.ranks[0] if exc.ranks else -1
            err = foreign_frame_error(self.data_ctx, peer, theirs) if theirs else None
            raise err or exc from None
        if self.role != "fold":
            if self.early:
                np.maximum(vals, tmp, out=vals)
            for step, peer in enumerate(self.peers, start=1):
                if step == 1 and self.first_done:
                    continue
                check.sendrecv(peer, vals.copy(), peer, tmp, step)
                np.maximum(vals, tmp, out=vals)
            if self.partner >= 0:
                check.send(self.partner, rd.RETURN_TAG, vals)
        if vals[0] == self.h and -vals[1] == self.h:
            return
        _disagreement(self.data_ctx, check)


def _disagreement(data_ctx: OpContext, check: OpContext) -> None:
    s = data_ctx.sig
    mine = np.array([s.op, s.dtype, s.redop, s.root, s.count], np.int64)
    table = np.empty(5 * check.size, np.int64)
    blocks = [table[5 * i : 5 * i + 5] for i in range(check.size)]
    blocks[check.rank][:] = mine
    ag.allgather_blocks(check, blocks, 64, tag0=1 << 12)
    by_call: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(blocks):
        by_call[describe(_sig_of(row))].append(data_ctx.ranks[i])
    parts = [
        f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} called {call}"
        for call, r in by_call.items()
    ]
    raise MismatchError(
        f"mismatched collective at {data_ctx.name}: {'; '.join(parts)}",
        op=data_ctx.op.label,
        seq=data_ctx.seq,
        group=data_ctx.group_id,
        ranks=[r for rs in by_call.values() for r in rs],
    )


def foreign_frame_error(ctx: OpContext, peer: int, sig: OpSig) -> MismatchError | None:
    """The error for a frame of ``ctx``'s operation that carries another signature."""
    if sig.op == OpCode.CHECK:
        # a confirmation frame: it carries the confirmed call's fields (see check_sig)
        if sig == check_sig(ctx.data_sig):
            return None
        theirs = OpSig(ctx.data_sig.op, sig.dtype, sig.redop, sig.root, sig.count)
    elif sig == ctx.data_sig:
        return None
    else:
        theirs = sig
    return ctx.mismatch_error(peer, theirs)
