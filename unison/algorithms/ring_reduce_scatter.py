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
from ._context import OpContext
from ._schedule import ring_neighbors, segments
from .cost import Link

__all__ = ["NAME", "cost", "reduce_scatter_blocks", "run", "supports"]

NAME = "ring"
WINDOW = 4


def cost(p: int, n: int, link: Link) -> float:
    f = (p - 1) / p
    return (p - 1) * link.alpha + f * n * link.beta + f * n * link.gamma


def supports(p: int, n: int) -> bool:
    return True


def reduce_scatter_blocks(
    ctx: OpContext, inputs: Sequence[np.ndarray], out: np.ndarray | None, kern: Kernel,
    seg: int, tag0: int = 0, inplace: bool = False,
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
    left, right = ring_neighbors(r, p)
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
        ssegs = segments(len(src_blk), seg)
        rsegs = segments(len(inputs[rc]), seg)
        base = tag0 + s * nseg
        sends = [None] * len(ssegs)
        recvs = [None] * len(rsegs)

        def post_send(j: int) -> None:
            o, n = ssegs[j]
            sends[j] = ctx.isend(right, base + j, src_blk[o : o + n])  # type: ignore[call-overload]

        def post_recv(j: int) -> None:
            _, n = rsegs[j]
            recvs[j] = ctx.irecv(left, base + j, tmp[j % WINDOW, :n])  # type: ignore[call-overload]

        for j in range(min(WINDOW, len(rsegs))):
            post_recv(j)
        for j in range(min(WINDOW, len(ssegs))):
            post_send(j)
        for j, (o, n) in enumerate(rsegs):
            ctx.wait(recvs[j])  # type: ignore[arg-type]
            if not inplace and s > 0 and j < len(sends):
                ctx.wait(sends[j])  # type: ignore[arg-type]  # work seg j is about to change
            kern(tmp[j % WINDOW, :n], inputs[rc][o : o + n], dst_blk[o : o + n])
            if j + WINDOW < len(rsegs):
                post_recv(j + WINDOW)
            if j + WINDOW < len(ssegs):
                ctx.wait(sends[j])  # type: ignore[arg-type]
                post_send(j + WINDOW)
        for j in range(len(rsegs), len(ssegs)):
            if sends[j] is None:
                post_send(j)
        ctx.wait(*[q for q in sends if q is not None])
        ctx.reset_pending()
    return tag0 + (p - 1) * nseg


def run(ctx: OpContext, inputs: Sequence[np.ndarray], out: np.ndarray, kern: Kernel,
        seg: int) -> None:
    reduce_scatter_blocks(ctx, inputs, out, kern, seg)
