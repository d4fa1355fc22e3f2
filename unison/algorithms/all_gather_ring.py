"""Ring all-gather.

Phases: p−1 steps; in step s rank r sends block (r−s) mod p to its right
neighbour and receives block (r−s−1) mod p from its left, straight into the
output block (no staging). Blocks travel in segments.

Cost (n bytes gathered in total): (p−1)α + ((p−1)/p)nβ, plus :func:`own_copy` (the
rank's own block copied into its output before any algorithm runs).
Preconditions: any p; blocks may differ in size.
Reference: Thakur, Rabenseifner & Gropp (2005), §4.1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..link import Link, crowding
from ._context import OpContext
from ._schedule import ring_neighbors, segments
from .topology import Topology

__all__ = ["NAME", "NEEDS", "allgather_blocks", "cost", "run", "supports"]

NAME = "ring"
NEEDS = "nothing beyond the group"


def own_copy(p: int, n: int, link: Link) -> float:
    """Seconds of every all-gather's copy of the rank's own block (n/p bytes) into its
    output, which the backend makes before the algorithm unless the input already lies
    there; the same for every algorithm, so it moves ``unison simulate``'s predictions,
    not the selector's choice (0 where the link knows no local copy rate)."""
    return crowding(p, link) * n / max(p, 1) * link.copy


def cost(p: int, n: int, link: Link) -> float:
    return (
        (p - 1) * link.alpha
        + crowding(p, link) * (p - 1) / p * n * link.beta
        + own_copy(p, n, link)
    )


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def allgather_blocks(ctx: OpContext, blocks: Sequence[np.ndarray], seg: int, tag0: int = 0) -> int:
    """``blocks[rank]`` holds this rank's data; fill every other block. Returns next tag."""
    p, r = ctx.size, ctx.rank
    if p == 1:
        return tag0
    left, right = ring_neighbors(r, p)
    nseg = len(segments(max(len(b) for b in blocks), seg))
    for s in range(p - 1):
        sc, rc = (r - s) % p, (r - s - 1) % p
        base = tag0 + s * nseg
        reqs = [
            ctx.irecv(left, base + j, blocks[rc][o : o + n])
            for j, (o, n) in enumerate(segments(len(blocks[rc]), seg))
        ]
        reqs += [
            ctx.isend(right, base + j, blocks[sc][o : o + n])
            for j, (o, n) in enumerate(segments(len(blocks[sc]), seg))
        ]
        ctx.wait(*reqs)
        ctx.reset_pending()
    return tag0 + (p - 1) * nseg


def run(ctx: OpContext, blocks: Sequence[np.ndarray], seg: int) -> None:
    allgather_blocks(ctx, blocks, seg)
