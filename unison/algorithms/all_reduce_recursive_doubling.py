"""Recursive-doubling all-reduce, for small messages.

Phases: with p' the largest power of two ≤ p, the first 2(p−p') ranks pair up
and the even one folds its data into the odd one; the p' remaining ranks then
exchange whole buffers with partners at distance 1, 2, 4, … (log₂p' steps),
reducing after each; finally folded ranks get the result back. Every rank
reduces the same pairs in the same order, so all ranks end bitwise identical.

Cost: ⌈log₂p⌉(α + nβ + nγ) (+ 2(α + nβ) when p is not a power of two).
Preconditions: any p; wins when α dominates (small n).
Reference: Thakur, Rabenseifner & Gropp (2005), §4.4.
"""

from __future__ import annotations

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, finalize_average
from ..link import Link, crowding, log2ceil
from ._context import OpContext
from ._schedule import pof2_floor, recursive_doubling_plan
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "recursive_doubling"
NEEDS = "nothing beyond the group"
RETURN_TAG = 1 << 20  # the result going back to a folded rank


def cost(p: int, n: int, link: Link) -> float:
    steps = log2ceil(pof2_floor(p)) if p > 1 else 0
    c = crowding(p, link)
    extra = 0.0 if p == pof2_floor(p) else 2 * (link.alpha + c * n * link.beta)
    return steps * (link.alpha + c * n * (link.beta + link.gamma)) + extra


def supports(p: int, n: int, topo: Topology) -> bool:
    return True


def run(
    ctx: OpContext, arr: np.ndarray, kern: Kernel, op: ReduceOp, dtype: DType, seg: int = 0
) -> None:
    """Whole-buffer exchanges; ``seg`` is accepted for a uniform signature and unused."""
    p, r = ctx.size, ctx.rank
    if p > 1:
        role, partner, peers = recursive_doubling_plan(r, p)
        last = RETURN_TAG
        if role == "fold":
            ctx.send(partner, 0, arr)
            ctx.recv(partner, last, arr)
        else:
            tmp = np.empty_like(arr)
            if partner >= 0:
                ctx.recv(partner, 0, tmp)
                kern(tmp, arr, arr)  # lower rank's data first, as on the folding side
            for step, peer in enumerate(peers, start=1):
                ctx.sendrecv(peer, arr, peer, tmp, step)
                if peer < r:
                    kern(tmp, arr, arr)
                else:
                    kern(arr, tmp, arr)
            if partner >= 0:
                ctx.send(partner, last, arr)
    if op is ReduceOp.AVG:
        finalize_average(arr, dtype, p)
