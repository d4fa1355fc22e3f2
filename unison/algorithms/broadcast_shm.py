"""Direct shared-memory broadcast: the root fills its slot, every other rank copies it out.

Phases, per round: the root copies a chunk into its slot half; sync (every rank
with every other, which also tells the root that the half it reuses two rounds
later has been read); the others copy the chunk out.

Cost (n bytes): one sync per round, plus the copies. With one round, the readers'
copies out wait for the root's copy in: 2n·c. With several, they overlap: while
the readers copy round r out of one half, the root fills the other half with round
r + 1, so only the first round's copy in is not hidden: (n + min(n, half))·c. When
ranks outnumber the cores, the readers' and the root's copies share them: the
overlapped n·c becomes n·c·p/cores (all p copies of a round on the cores).
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
    copies = (crowding(p, link) * n + min(n, link.half)) * link.copy
    return sync_cost(p, link) * rounds(n, link) + copies


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
