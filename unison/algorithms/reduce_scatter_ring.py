"""Ring reduce-scatter.

Phases: p−1 steps; in step s rank r sends block (r−s−1) mod p to its right
neighbour and receives block (r−s−2) mod p from its left, reducing it into its
partial sum, so after p−1 steps rank r holds block r reduced over all ranks.
Blocks are moved in segments with a window of receives posted ahead, so memory
stays at a few segments however large the message.

Cost (n bytes in total): (p−1)α + ((p−1)/p)nβ + ((p−1)/p)nγ.
Preconditions: any p; blocks may differ in size (by any amount).
Reference: Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH" (2005), §4.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..buffers import Kernel
from ..link import Link, crowding
from ..transport.request import Request
from ._context import OpContext
from ._schedule import ring_neighbors, segments
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "reduce_scatter_blocks", "run", "supports"]

NAME = "ring"
NEEDS = "nothing beyond the group"
WINDOW = 4


def cost(p: int, n: int, link: Link) -> float:
    f = (p - 1) / p
    return (p - 1) * link.alpha + crowding(p, link) * f * n * (link.beta + link.gamma)


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def _step(
    ctx: OpContext,
    src_blk: np.ndarray,
    own: np.ndarray,
    dst_blk: np.ndarray,
    tmp: np.ndarray,
    base: int,
    seg: int,
    kern: Kernel,
    *,
    wait_before_write: bool,
) -> None:
    """One ring step: send ``src_blk`` right; ``dst_blk = received (op) own``, by segments.

    A window of receives (``tmp`` slots) and sends is kept in flight. With
    ``wait_before_write`` the segment being overwritten is first confirmed sent
    (``src_blk`` and ``dst_blk`` share the scratch buffer then).
    """
    p, r = ctx.size, ctx.rank
    left, right = ring_neighbors(r, p)
    ssegs = segments(len(src_blk), seg)
    rsegs = segments(len(own), seg)
    sends: list[Request | None] = [None] * len(ssegs)
    recvs: list[Request | None] = [None] * len(rsegs)

    def post_send(j: int) -> None:
        o, n = ssegs[j]
        sends[j] = ctx.isend(right, base + j, src_blk[o : o + n])

    def post_recv(j: int) -> None:
        _, n = rsegs[j]
        recvs[j] = ctx.irecv(left, base + j, tmp[j % WINDOW, :n])

    for j in range(min(WINDOW, len(rsegs))):
        post_recv(j)
    for j in range(min(WINDOW, len(ssegs))):
        post_send(j)
    for j, (o, n) in enumerate(rsegs):
        ctx.wait(_req(recvs[j]))
        if wait_before_write and j < len(sends):
            ctx.wait(_req(sends[j]))
        kern(tmp[j % WINDOW, :n], own[o : o + n], dst_blk[o : o + n])
        if j + WINDOW < len(rsegs):
            post_recv(j + WINDOW)
        if j + WINDOW < len(ssegs):
            ctx.wait(_req(sends[j]))
            post_send(j + WINDOW)
    for j in range(len(rsegs), len(ssegs)):
        if sends[j] is None:
            post_send(j)
    ctx.wait(*[q for q in sends if q is not None])


def _req(req: Request | None) -> Request:
    assert req is not None  # posted before it is waited for, by construction
    return req


def reduce_scatter_blocks(
    ctx: OpContext,
    inputs: Sequence[np.ndarray],
    out: np.ndarray | None,
    kern: Kernel,
    seg: int,
    tag0: int = 0,
    inplace: bool = False,
) -> int:
    """Reduce block i of every rank into rank i. Returns the next free tag.

    ``inplace``: ``inputs`` may be overwritten and the result stays in
    ``inputs[rank]`` (``out`` is ignored). Otherwise ``inputs`` are only read and
    the result is written to ``out``.
    """
    p, r = ctx.size, ctx.rank
    if p == 1:
        if not inplace and out is not None:
            out[:] = inputs[0]
        return tag0
    longest = max(len(b) for b in inputs)
    nseg = len(segments(longest, seg))
    slot_len = min(seg, longest)
    tmp = np.empty((WINDOW, slot_len), dtype=inputs[0].dtype)
    work = None if inplace else np.empty(longest, dtype=inputs[0].dtype)
    for s in range(p - 1):
        sc, rc = (r - s - 1) % p, (r - s - 2) % p
        last = s == p - 2
        if inplace or s == 0:
            src_blk = inputs[sc]
        else:
            assert work is not None
            src_blk = work[: len(inputs[sc])]
        if inplace:
            dst_blk = inputs[rc]
        elif last:
            assert out is not None
            dst_blk = out
        else:
            assert work is not None
            dst_blk = work[: len(inputs[rc])]
        _step(
            ctx,
            src_blk,
            inputs[rc],
            dst_blk,
            tmp,
            tag0 + s * nseg,
            seg,
            kern,
            wait_before_write=not inplace and s > 0,
        )
        ctx.reset_pending()
    return tag0 + (p - 1) * nseg


def run(
    ctx: OpContext, inputs: Sequence[np.ndarray], out: np.ndarray, kern: Kernel, seg: int
) -> None:
    reduce_scatter_blocks(ctx, inputs, out, kern, seg)
