"""Direct shared-memory reduce-scatter: each rank reduces its block out of its peers' slots.

Phases, per round: every rank copies the parts of its input blocks that the
others own into its slot half (block j's part at position j); sync; rank r
reduces, in rank order, its own block and the peers' copies of block r straight
into its output. One synchronisation per round, no message carries data.

Cost per round (n bytes in total): one sync + ((p−1)/p)·n·c + ((p−1)/p)·n·γ.
Preconditions: every rank on one host (a :class:`SharedLink`); blocks of equal
length; the world group (others run :mod:`.reduce_scatter_ring`).
Reference: OpenMPI ``coll/sm``; Li et al. (HPDC 2013).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..buffers import Kernel, copy_into
from ..link import Link, SharedLink, crowding
from . import reduce_scatter_ring
from ._context import OpContext
from .all_reduce_shm import reduce_slice
from .shm_arena import SHM_NEEDS, arena_of, round_for, round_plan, rounds, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "shm"
NEEDS = SHM_NEEDS


def _per_byte(p: int, link: Link) -> float:
    return crowding(p, link) * (p - 1) / p * (link.copy + link.gamma)


def round_size(p: int, n: int, link: Link) -> int:
    """Bytes of the ``p`` inputs per round (:func:`.shm_arena.round_plan`)."""
    return round_plan(p, link, lambda lk: _per_byte(p, lk))[0]


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    r, per_byte = round_plan(p, link, lambda lk: _per_byte(p, lk))
    return sync_cost(p, link) * rounds(n, link, r) + n * per_byte


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def run(
    ctx: OpContext, inputs: Sequence[np.ndarray], out: np.ndarray, kern: Kernel, seg: int
) -> None:
    if ctx.size == 1 or len({len(b) for b in inputs}) != 1:
        reduce_scatter_ring.run(ctx, inputs, out, kern, seg)
        return
    arena = arena_of(ctx, NAME)
    p, me = ctx.size, ctx.rank
    glob = ctx.ranks
    m = len(out)
    per_round = round_for(round_size, ctx.topo, p, out.nbytes * p) // p  # bytes of each input
    step = arena.step(out.dtype, min(per_round, arena.half // p), out.nbytes)
    for tag, start in enumerate(range(0, m, step) or [0]):
        k = min(step, m - start)
        h = arena.next_half()
        slots = [arena.typed(glob[q], h, k * p, out.dtype) for q in range(p)]
        mine = slots[me]
        for j in range(p):
            if j != me:
                copy_into(mine[j * k : (j + 1) * k], inputs[j][start : start + k])
        sync(ctx, tag)
        srcs = [
            inputs[me][start : start + k] if q == me else slots[q][me * k : (me + 1) * k]
            for q in range(p)
        ]
        reduce_slice(kern, srcs, out[start : start + k])
