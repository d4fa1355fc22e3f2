"""Dissemination barrier.

Phases: ⌈log₂p⌉ rounds; in round k rank r signals rank (r+2ᵏ) mod p and waits
for rank (r−2ᵏ) mod p. After the last round every rank has (transitively)
heard from every other, so none leaves before all have arrived.

Cost: ⌈log₂p⌉α.
Preconditions: any p.
Reference: Hensgen, Finkel & Manber, "Two algorithms for barrier
synchronization" (1988).
"""

from __future__ import annotations

import numpy as np

from ..link import Link, log2ceil
from ._context import OpContext
from ._schedule import dissemination_peers
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "dissemination"
NEEDS = "nothing beyond the group"
_EMPTY = np.empty(0, np.uint8)


def cost(p: int, n: int, link: Link) -> float:
    return log2ceil(p) * link.alpha


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(ctx: OpContext) -> None:
    for k, (dst, src) in enumerate(dissemination_peers(ctx.rank, ctx.size)):
        ctx.sendrecv(dst, _EMPTY, src, np.empty(0, np.uint8), k)
