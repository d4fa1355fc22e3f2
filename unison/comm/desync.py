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
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import numpy as np

from .._types import ReduceOp
from ..algorithms import OpCode, OpContext, describe
from ..algorithms import allreduce_recursive_doubling as rd
from ..algorithms import ring_allgather as ag
from ..buffers import DType, kernel
from ..errors import MismatchError
from ..transport.framing import OpSig

__all__ = ["ROOTED", "confirm", "foreign_frame_error", "sig_hash"]

ROOTED = frozenset({OpCode.BROADCAST, OpCode.REDUCE, OpCode.GATHER, OpCode.SCATTER})
_MAX = kernel(ReduceOp.MAX, DType.INT64)


def sig_hash(sig: OpSig) -> int:
    raw = np.array([sig.op, sig.dtype, sig.redop, sig.root, sig.count], np.int64).tobytes()
    return zlib.crc32(raw)


def _sig_of(row: np.ndarray) -> OpSig:
    return OpSig(int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))


def confirm(data_ctx: OpContext, check: OpContext) -> None:
    """Raise MismatchError on every rank unless all ranks ran ``data_ctx.sig``."""
    h = sig_hash(data_ctx.sig)
    vals = np.array([h, -h], np.int64)
    rd.run(check, vals, _MAX, ReduceOp.MAX, DType.INT64)
    if vals[0] == h and -vals[1] == h:
        return
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
    if sig.op == OpCode.CHECK or sig == ctx.data_sig:
        return None
    return MismatchError(
        f"mismatched collective at {ctx.name}: rank {peer} called {describe(sig)} but rank "
        f"{ctx.ranks[ctx.rank]} called {describe(ctx.data_sig)}",
        op=ctx.op.label,
        seq=ctx.seq,
        group=ctx.group_id,
        ranks=(peer, ctx.ranks[ctx.rank]),
    )
