"""Direct shared-memory all-gather: each rank copies every block out of its owner's slot.

Phases, per round: every rank copies its part of its block into its slot half;
sync; every rank copies the peers' parts out of their slots. One
synchronisation per round; each byte is copied once in and once out per reader.

Cost per round (n bytes gathered in total): one sync + n·c (the own part in, the
peers' parts out), plus the own block into the output (:func:`.all_gather_ring.own_copy`).
Preconditions: every rank on one host (a :class:`SharedLink`); blocks of equal
length; the world group (others run :mod:`.all_gather_ring`).
Reference: OpenMPI ``coll/sm``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..buffers import copy_into
from ..link import Link, SharedLink, crowding
from . import all_gather_ring
from ._context import OpContext
from .shm_arena import SHM_NEEDS, arena_of, round_for, round_plan, rounds, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "shm"
NEEDS = SHM_NEEDS


def _per_byte(p: int, link: Link) -> float:
    """Seconds per byte of the own block (a round moves ``p`` times its bytes)."""
    return p * crowding(p, link) * link.copy


def round_size(p: int, n: int, link: Link) -> int:
    """Bytes of the own block per round (:func:`.shm_arena.round_plan`)."""
    return round_plan(p, link, lambda lk: _per_byte(p, lk))[0]


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    r, per_byte = round_plan(p, link, lambda lk: _per_byte(p, lk))
    steps = rounds(n // p, link, r)
    return sync_cost(p, link) * steps + n // p * per_byte + all_gather_ring.own_copy(p, n, link)


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def run(ctx: OpContext, blocks: Sequence[np.ndarray], seg: int) -> None:
    if ctx.size == 1 or len({len(b) for b in blocks}) != 1:
        all_gather_ring.run(ctx, blocks, seg)
        return
    arena = arena_of(ctx, NAME)
    p, me = ctx.size, ctx.rank
    glob = ctx.ranks
    m = len(blocks[me])
    step = arena.step(
        blocks[me].dtype,
        round_for(round_size, ctx.topo, p, blocks[me].nbytes * p),
        blocks[me].nbytes,
    )
    for tag, start in enumerate(range(0, m, step) or [0]):
        k = min(step, m - start)
        h = arena.next_half()
        copy_into(arena.typed(glob[me], h, k, blocks[me].dtype), blocks[me][start : start + k])
        sync(ctx, tag)
        for q in range(p):
            if q != me:
                copy_into(blocks[q][start : start + k], arena.typed(glob[q], h, k, blocks[q].dtype))
