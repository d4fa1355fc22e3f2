"""Direct shared-memory all-reduce: every rank reduces its 1/p slice out of its peers' slots.

Phases, per round of at most half a slot (see :mod:`.shm_arena`): each rank
copies the parts of its chunk that others reduce into its slot half; sync; rank
r reduces slice r of the chunk from its own buffer and every peer's slot (in
rank order, so the result is the same whatever rank computes it) into its slot
and its buffer; sync; each rank copies the other reduced slices out of their
owners' slots. Every slice is reduced exactly once, so all ranks end bitwise
identical; no message carries data.

Cost per round (n bytes): 2·sync (two synchronisations, each the measured slot
barrier, :func:`unison.link.sync_at`) + (2(p−1)+1)/p·n·c (copies in and out; c the local copy cost)
+ ((p−1)/p)·n·γ, the per-byte terms scaled by ``p / cores`` when ranks outnumber
the cores. :mod:`.all_reduce_shm_one` trades the second synchronisation and the
copies out for redundant arithmetic; the selector weighs the two.
Preconditions: every rank of the job on one host with shared memory (the link
is a :class:`SharedLink`); the world group (others run :mod:`.all_reduce_ring`).
Reference: the direct shared-memory reduce-scatter/all-gather of Li et al.,
"NUMA-aware shared-memory collective communication for MPI" (HPDC 2013), and
OpenMPI's ``coll/sm``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, copy_into, finalize_average
from ..buffers.pieces import Pieces
from ..link import Link, SharedLink, crowding
from . import all_reduce_ring
from ._context import OpContext
from ._schedule import chunks
from .shm_arena import SHM_NEEDS, arena_of, round_for, round_plan, rounds, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "run_pieces", "supports"]

NAME = "shm"
NEEDS = SHM_NEEDS


def _per_byte(p: int, link: Link) -> float:
    f = (p - 1) / p
    return crowding(p, link) * ((2 * f + 1 / p) * link.copy + f * link.gamma)


def round_size(p: int, n: int, link: Link) -> int:
    """Bytes per round (:func:`.shm_arena.round_plan`; two syncs a round)."""
    return round_plan(p, link, lambda lk: _per_byte(p, lk), syncs=2)[0]


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2:
        return math.inf
    r, per_byte = round_plan(p, link, lambda lk: _per_byte(p, lk), syncs=2)
    return 2 * sync_cost(p, link) * rounds(n, link, r) + n * per_byte


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared


def reduce_slice(kern: Kernel, srcs: list[np.ndarray], dst: np.ndarray) -> None:
    """``dst = srcs[0] op srcs[1] op ...`` (dst may alias none of srcs)."""
    if len(srcs) == 1:
        copy_into(dst, srcs[0])
        return
    kern(srcs[0], srcs[1], dst)
    for s in srcs[2:]:
        kern(dst, s, dst)


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
    read and written where its pieces lie; ``finish`` runs on each reduced slice (in
    place) before the peers copy it, as the average's division does."""
    p, me = ctx.size, ctx.rank  # at least 2 (run() hands a group of one to the ring)
    arena = arena_of(ctx, NAME)
    glob = ctx.ranks
    step = arena.step(src.dtype, round_for(round_size, ctx.topo, p, src.nbytes), src.nbytes)
    tag = 0
    for start in range(0, src.count, step) or [0]:
        n = min(step, src.count - start)
        parts = chunks(n, p)
        h = arena.next_half()
        slots = [arena.typed(glob[q], h, n, src.dtype) for q in range(p)]
        mine = slots[me]
        for j, (o, k) in enumerate(parts):
            if j != me and k:
                src.read(start + o, mine[o : o + k])
        sync(ctx, tag)
        o, k = parts[me]
        if k:
            # the whole slice in one kernel call per peer: reducing cache-sized blocks
            # and copying each back at once measured 2-3x slower (one slow pass per
            # block over the peers' freshly written slots instead of one streaming pass)
            e = o + k
            own = src.view(start + o, start + e)
            if own is None:  # the slice spans pieces: gathered once
                own = np.empty(k, src.dtype)
                src.read(start + o, own)
            srcs = [own if q == me else slots[q][o:e] for q in range(p)]
            reduced = mine[o:e]
            reduce_slice(kern, srcs, reduced)
            if op is ReduceOp.AVG:
                finalize_average(reduced, dtype, p)
            if finish is not None:
                finish(reduced)
            dst.write(start + o, reduced)
        sync(ctx, tag + 1)
        tag += 2
        for j, (o, k) in enumerate(parts):
            if j != me and k:
                dst.write(start + o, slots[j][o : o + k])
