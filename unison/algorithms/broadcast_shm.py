"""Direct shared-memory broadcast: the root fills its slot, every other rank copies it out.

Phases, per round: the root copies a chunk into its slot half; sync (every rank
with every other, which also tells the root that the half it reuses two rounds
later has been read); the others copy the chunk out.

Cost per round (n bytes): 2(p−1)α + 2n·c (the root's copy in, then the readers'
copies out, which run in parallel).
Preconditions: every rank on one host (a :class:`SharedLink`); the world group
(others run :mod:`.broadcast_binomial`).
Reference: OpenMPI ``coll/sm``.
"""

from __future__ import annotations

import math

import numpy as np

from ..buffers import copy_into
from ..link import Link, SharedLink, crowding
from . import broadcast_binomial
from ._context import OpContext
from .shm_arena import SHM_NEEDS, arena_of, rounds, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "shm"
NEEDS = SHM_NEEDS


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    return sync_cost(p, link) * rounds(n, link) + crowding(p, link) * 2 * n * link.copy


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def run(ctx: OpContext, arr: np.ndarray, root: int, seg: int) -> None:
    if ctx.size == 1:
        broadcast_binomial.run(ctx, arr, root, seg)
        return
    arena = arena_of(ctx, NAME)
    me = ctx.rank
    src = ctx.ranks[root]
    step = arena.elems(arr.dtype)
    for tag, start in enumerate(range(0, len(arr), step) or [0]):
        chunk = arr[start : start + step]
        h = arena.next_half()
        slot = arena.typed(src, h, len(chunk), arr.dtype)
        if me == root:
            copy_into(slot, chunk)
        sync(ctx, tag)
        if me != root:
            copy_into(chunk, slot)
