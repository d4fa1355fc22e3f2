"""Pairwise-exchange all-to-all.

Phases: p−1 steps; in step i rank r sends its block for rank (r+i) mod p and
receives the block from rank (r−i) mod p, straight into the output block. One
send and one receive in flight per step keeps every link busy without flooding
any single rank.

Cost (n bytes sent per rank): (p−1)α + ((p−1)/p)nβ.
Preconditions: any p; blocks may differ in size (unequal splits).
Reference: Thakur, Rabenseifner & Gropp (2005), §4.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import MismatchError
from ..link import Link
from ._context import OpContext
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "pairwise"
NEEDS = "nothing beyond the group"


def cost(p: int, n: int, link: Link) -> float:
    return (p - 1) * link.alpha + (p - 1) / p * n * link.beta


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(ctx: OpContext, outs: Sequence[np.ndarray], ins: Sequence[np.ndarray]) -> None:
    p, r = ctx.size, ctx.rank
    if outs[r].nbytes != ins[r].nbytes:  # split sizes that disagree with themselves
        me = ctx.ranks[r]
        raise MismatchError(
            f"mismatched message sizes at {ctx.name}: rank {me} sends itself "
            f"{ins[r].nbytes} bytes but expects {outs[r].nbytes} bytes from itself",
            op=ctx.op.label,
            seq=ctx.seq,
            group=ctx.group_id,
            ranks=(me,),
        )
    outs[r][:] = ins[r]
    for i in range(1, p):
        dst, src = (r + i) % p, (r - i) % p
        ctx.sendrecv(dst, ins[dst], src, outs[src], i)
