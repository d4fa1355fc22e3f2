"""Binomial-tree reduce to a root, segment by segment.

Phases: mirror image of the binomial broadcast: each node receives partial
results from its children (smallest subtree first), reduces them into its own,
and sends the result to its parent. Non-root buffers are left unchanged (inner
nodes accumulate in scratch), as MPI_Reduce leaves its send buffer.

Cost: ⌈log₂p⌉(α + nβ + nγ).
Preconditions: any p, any root. Children are combined in a fixed order, so the
result does not depend on timing.
Reference: Thakur, Rabenseifner & Gropp (2005), §4.3.
"""

from __future__ import annotations

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, finalize_average
from ..link import Link, log2ceil
from ._context import OpContext
from ._schedule import binomial_children, binomial_parent, segments
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "binomial"
NEEDS = "nothing beyond the group"


def cost(p: int, n: int, link: Link) -> float:
    return log2ceil(p) * (link.alpha + n * link.beta + n * link.gamma)


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(
    ctx: OpContext, arr: np.ndarray, root: int, kern: Kernel, op: ReduceOp, dtype: DType, seg: int
) -> None:
    p, r = ctx.size, ctx.rank
    if p > 1:
        parent = binomial_parent(r, p, root)
        children = binomial_children(r, p, root)[::-1]
        segs = segments(len(arr), seg)
        width = segs[0][1]
        tmp = np.empty((len(children), width), dtype=arr.dtype) if children else None
        scratch = np.empty(width, dtype=arr.dtype) if children and parent >= 0 else None
        for j, (o, n) in enumerate(segs):
            mine = arr[o : o + n]
            if children:
                assert tmp is not None
                recvs = [ctx.irecv(c, j, tmp[k, :n]) for k, c in enumerate(children)]
                if scratch is None:
                    acc = mine
                else:
                    acc = scratch[:n]
                    acc[:] = mine
                for k, req in enumerate(recvs):
                    ctx.wait(req)
                    kern(acc, tmp[k, :n], acc)
            else:
                acc = mine
            if parent >= 0:
                ctx.send(parent, j, acc)
            ctx.reset_pending()
    if op is ReduceOp.AVG and r == root:
        finalize_average(arr, dtype, p)
