"""Ring all-reduce: ring reduce-scatter, then ring all-gather, in place.

Phases: the buffer is cut into p blocks; p−1 reduce-scatter steps leave block r
fully reduced on rank r; p−1 all-gather steps circulate the reduced blocks.
Each rank sends and receives 2(p−1)/p of the buffer — bandwidth-optimal.
Segmented and pipelined (a window of receives posted ahead), so extra memory
is a few segments regardless of message size.

Cost: 2(p−1)α + 2((p−1)/p)nβ + ((p−1)/p)nγ.
Preconditions: any p; best for large n (the 2(p−1)α term dominates small n).
Reference: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations" (2009); Thakur, Rabenseifner & Gropp (2005).
"""

from __future__ import annotations

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, finalize_average
from ..link import Link, crowding
from ._context import OpContext
from ._schedule import chunks
from .all_gather_ring import allgather_blocks
from .reduce_scatter_ring import reduce_scatter_blocks
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "ring"
NEEDS = "nothing beyond the group"


def cost(p: int, n: int, link: Link) -> float:
    f = (p - 1) / p
    work = 2 * f * n * link.beta + f * n * link.gamma
    return 2 * (p - 1) * link.alpha + crowding(p, link) * work


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(
    ctx: OpContext, arr: np.ndarray, kern: Kernel, op: ReduceOp, dtype: DType, seg: int
) -> None:
    p = ctx.size
    blocks = [arr[o : o + n] for o, n in chunks(len(arr), p)]
    tag = reduce_scatter_blocks(ctx, blocks, None, kern, seg, inplace=True)
    if op is ReduceOp.AVG:
        finalize_average(blocks[ctx.rank], dtype, p)
    allgather_blocks(ctx, blocks, seg, tag0=tag)
