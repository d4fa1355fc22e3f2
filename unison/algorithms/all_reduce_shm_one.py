"""One-phase shared-memory all-reduce: every rank reduces the whole chunk out of every slot.

Per round of at most half a slot (see :mod:`.shm_arena`): each rank copies its
chunk into its slot half; sync; each rank reduces all ``p`` slots, in rank order,
straight into its own buffer. One synchronisation per round instead of the two
of :mod:`.all_reduce_shm` (reduce-scatter, then all-gather), no copy of a
reduced slice back and forth, and no rank waits for another's reduction. Every
rank evaluates the same expression on the same bytes, so all end bitwise
identical. The price is redundant arithmetic: each rank reduces ``(p−1)·n``
instead of ``((p−1)/p)·n`` bytes, which pays at small ``p`` (at ``p = 2`` the
two-phase algorithm saves half a reduction but adds a synchronisation, a
copy-back and a second pass over the peer's slot).

Cost per round (n bytes): one sync + n·c + (p−1)·n·γ, the per-byte terms
scaled by ``p / cores`` when ranks outnumber the cores (the redundant work then
queues for the same cores).
Preconditions: every rank of the job on one host with shared memory (the link
is a :class:`SharedLink`); the world group (others run :mod:`.all_reduce_ring`).
Reference: the "replicated reduction" variant of direct shared-memory
all-reduce, e.g. Li et al., "NUMA-aware shared-memory collective communication
for MPI" (HPDC 2013), and the ``allreduce_sm`` of OpenMPI's ``coll/sm`` for
small ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, finalize_average
from ..buffers.pieces import Pieces
from ..link import Link, SharedLink, crowding
from . import all_reduce_ring
from ._context import OpContext
from .shm_arena import SHM_NEEDS, arena_of, round_for, round_plan, rounds, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "run_pieces", "supports"]

NAME = "shm_one"
NEEDS = SHM_NEEDS


def _per_byte(p: int, link: Link) -> float:
    return crowding(p, link) * (link.copy + (p - 1) * link.gamma)


def round_size(p: int, n: int, link: Link) -> int:
    """Bytes per round (:func:`.shm_arena.round_plan`)."""
    return round_plan(p, link, lambda lk: _per_byte(p, lk))[0]


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    r, per_byte = round_plan(p, link, lambda lk: _per_byte(p, lk))
    return sync_cost(p, link) * rounds(n, link, r) + n * per_byte


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def run(
    ctx: OpContext, arr: np.ndarray, kern: Kernel, op: ReduceOp, dtype: DType, seg: int
) -> None:
    if ctx.size == 1:
        all_reduce_ring.run(ctx, arr, kern, op, dtype, seg)
        return
    whole = Pieces.of(arr)
    run_pieces(ctx, whole, whole, kern, op, dtype)


def run_pieces(
    ctx: OpContext,
    src: Pieces,
    dst: Pieces,
    kern: Kernel,
    op: ReduceOp,
    dtype: DType,
    finish: Callable[[np.ndarray], None] | None = None,
) -> None:
    """:func:`run` from ``src`` into ``dst`` (of one count; the same for in place), each
    read and written where its pieces lie; ``finish`` then runs on every range of the
    result (in place), as the average's division does."""
    p, me = ctx.size, ctx.rank  # at least 2 (run() hands a group of one to the ring)
    arena = arena_of(ctx, NAME)
    glob = ctx.ranks
    step = arena.step(src.dtype, round_for(round_size, ctx.topo, p, src.nbytes), src.nbytes)
    for tag, start in enumerate(range(0, src.count, step) or [0]):
        n = min(step, src.count - start)
        h = arena.next_half()
        slots = [arena.typed(glob[q], h, n, src.dtype) for q in range(p)]
        src.read(start, slots[me])
        sync(ctx, tag)
        for off, out in dst.spans(start, start + n):
            e = off + len(out)
            # every rank computes the same expression: slot 0 op slot 1 op ... (this
            # rank's own term read from its input only when one kernel call does it
            # all; otherwise from its slot, since ``out`` may be that input and is
            # overwritten by the first partial result)
            own = src.view(start + off, start + e) if p == 2 else None
            srcs = [own if q == me and own is not None else slots[q][off:e] for q in range(p)]
            kern(srcs[0], srcs[1], out)
            for q in range(2, p):
                kern(out, srcs[q], out)
            if op is ReduceOp.AVG:
                finalize_average(out, dtype, p)
            if finish is not None:
                finish(out)
