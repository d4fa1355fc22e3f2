"""Linear gather and scatter: the root talks to every rank directly.

Phases: one step; the root posts all p−1 receives (gather) or sends (scatter)
at once, straight into/out of the users' blocks; others send or receive once.

Cost (n bytes in total): (p−1)α + ((p−1)/p)nβ at the root.
Preconditions: any p, any root; blocks may differ in size.
Reference: Thakur, Rabenseifner & Gropp (2005), §4.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..link import Link
from ._context import OpContext
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "gather", "scatter", "supports"]

NAME = "linear"
NEEDS = "nothing beyond the group"


def cost(p: int, n: int, link: Link) -> float:
    return (p - 1) * link.alpha + (p - 1) / p * n * link.beta


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def gather(
    ctx: OpContext, mine: np.ndarray, blocks: Sequence[np.ndarray] | None, root: int
) -> None:
    if ctx.rank != root:
        ctx.send(root, 0, mine)
        return
    assert blocks is not None
    reqs = [ctx.irecv(i, 0, blocks[i]) for i in range(ctx.size) if i != root]
    blocks[root][:] = mine
    ctx.wait(*reqs)


def scatter(
    ctx: OpContext, mine: np.ndarray, blocks: Sequence[np.ndarray] | None, root: int
) -> None:
    if ctx.rank != root:
        ctx.recv(root, 0, mine)
        return
    assert blocks is not None
    reqs = [ctx.isend(i, 0, blocks[i]) for i in range(ctx.size) if i != root]
    mine[:] = blocks[root]
    ctx.wait(*reqs)
