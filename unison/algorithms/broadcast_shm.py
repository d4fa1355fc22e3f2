"""Direct shared-memory broadcast: the root fills its slot, every other rank copies it out.

Phases, per round: the root copies a chunk into its slot half; sync (every rank
with every other, which also tells the root that the half it reuses two rounds
later has been read); the others copy the chunk out.

Rounds are pipelined: while the readers copy round r out of one half, the root
fills the other half with round r + 1, so only the first round's copy in is not
hidden. A message that fits one half is still cut into k rounds
(:func:`.shm_arena.pipeline_bytes`, from the link model: k = √(n·c / sync)), so
the readers start after n/k bytes instead of after all n.

Cost (n bytes, k rounds of b = ⌈n/k⌉ bytes): k·sync + (n + b)·c. When ranks
outnumber the cores, the readers' and the root's copies share them: the
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
from .shm_arena import (
    SHM_NEEDS,
    arena_of,
    pipeline_bytes,
    pipeline_plan,
    round_for,
    rounds,
    sync,
    sync_cost,
)
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "shm"
NEEDS = SHM_NEEDS


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    b, c = pipeline_plan(p, n, link)
    b = min(n, b)
    copies = (crowding(p, link) * n + b) * c
    return sync_cost(p, link) * rounds(n, link, b) + copies


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def run(ctx: OpContext, arr: np.ndarray, root: int, seg: int) -> None:
    if ctx.size == 1:
        broadcast_binomial.run(ctx, arr, root, seg)
        return
    arena = arena_of(ctx, NAME)
    me = ctx.rank
    src = ctx.ranks[root]
    step = arena.step(
        arr.dtype, round_for(pipeline_bytes, ctx.topo, ctx.size, arr.nbytes), arr.nbytes
    )
    for tag, start in enumerate(range(0, len(arr), step) or [0]):
        chunk = arr[start : start + step]
        h = arena.next_half()
        slot = arena.typed(src, h, len(chunk), arr.dtype)
        if me == root:
            copy_into(slot, chunk)
        sync(ctx, tag)
        if me != root:
            copy_into(chunk, slot)
