"""Binomial-tree broadcast, segmented and pipelined.

Phases: the root's data flows down a binomial tree (each node receives from its
parent once, then forwards to its children, largest subtree first). The buffer
moves in segments: receives for every segment are posted at once straight into
the destination, and each segment is forwarded as soon as it arrives, so deeper
levels start before the upper ones finish.

Cost: ⌈log₂p⌉(α + nβ) unpipelined; with s segments ≈ (⌈log₂p⌉ + s − 1)(α + (n/s)β).
Preconditions: any p, any root.
Reference: Thakur, Rabenseifner & Gropp (2005), §4.2.
"""

from __future__ import annotations

import numpy as np

from ..link import Link, crowding, log2ceil
from ._context import OpContext
from ._schedule import binomial_children, binomial_parent, segments
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "binomial"
NEEDS = "nothing beyond the group"


def cost(p: int, n: int, link: Link) -> float:
    return log2ceil(p) * (link.alpha + crowding(p, link) * n * link.beta)


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(ctx: OpContext, arr: np.ndarray, root: int, seg: int) -> None:
    p, r = ctx.size, ctx.rank
    if p == 1:
        return
    parent = binomial_parent(r, p, root)
    children = binomial_children(r, p, root)
    segs = segments(len(arr), seg)
    recvs = (
        [ctx.irecv(parent, j, arr[o : o + n]) for j, (o, n) in enumerate(segs)]
        if parent >= 0
        else []
    )
    sends = []
    for j, (o, n) in enumerate(segs):
        if recvs:
            ctx.wait(recvs[j])
        sends += [ctx.isend(c, j, arr[o : o + n]) for c in children]
    ctx.wait(*sends)
