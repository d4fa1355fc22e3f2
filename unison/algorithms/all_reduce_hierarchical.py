"""Hierarchical all-reduce: reduce-scatter inside each host, all-reduce across hosts
slice by slice, all-gather inside each host (Horovod's hierarchical all-reduce,
NCCL's tree/ring split between NVLink and the network).

Phases, with H hosts of L ranks each (ranks contiguous by host), n bytes:

1. intra-host ring reduce-scatter among the L local ranks (shared memory): local
   rank j ends with slice j (n/L bytes) reduced over its host;
2. inter-host all-reduce of slice j among the H ranks with local rank j — L
   independent rings (or recursive doublings for small slices) run at once, so every
   process that reaches the network carries 1/L of the data;
3. intra-host ring all-gather of the L reduced slices.

Cost, intra link (αᵢ, βᵢ), inter link (αₒ, βₒ), γ per byte reduced; the L inter
phases share the host's NIC, so their bytes count L times against βₒ:

    T = 2(L−1)αᵢ + 2((L−1)/L)·n·βᵢ + ((L−1)/L)·n·γ
      + min( 2(H−1)αₒ + 2((H−1)/H)·n·βₒ + ((H−1)/H)·(n/L)·γ,        [ring]
             ⌈log₂H⌉(αₒ + n·βₒ + (n/L)·γ) )                       [recursive doubling]

Against the flat ring's 2(p−1)αₒ + 2((p−1)/p)·n·βₒ with p = HL, the network
carries 2(H−1)/H instead of 2(HL−1)/(HL) of the buffer (1.5× less for 2 × 2) and
pays 2(H−1) instead of 2(HL−1) network latencies.

Preconditions: the group spans at least two hosts with equally many ranks on each,
contiguous by host (else the flat ring runs, the same choice on every rank); the
selector considers it for the world group of a multi-host job
(:class:`~unison.link.TwoLevelLink`). ``UNISON_ALGO=all_reduce:hierarchical`` on one host
raises :class:`~unison.errors.UnsupportedError`.
Reference: Sergeev & Del Balso, "Horovod" (2018), hierarchical all-reduce; Thakur,
Rabenseifner & Gropp (2005) for the ring and recursive-doubling phases.
"""

from __future__ import annotations

import math

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, Kernel, finalize_average
from ..errors import UnsupportedError
from ..link import Link, TwoLevelLink
from . import all_reduce_recursive_doubling, all_reduce_ring
from ._context import OpContext
from ._schedule import chunks
from .all_gather_ring import allgather_blocks
from .reduce_scatter_ring import reduce_scatter_blocks
from .sub_context import SubContext
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "hierarchical"
NEEDS = "ranks on more than one host, the same number on each"
INTER_TAGS = 1 << 24  # tag base of the inter-host phase (the intra phases use 0..)


def _inter(hosts: int, per_host: int, n: int, link: Link) -> tuple[float, bool]:
    """Predicted inter-host time and whether recursive doubling beats the ring."""
    shared = Link(link.alpha, link.beta * per_host, link.gamma)  # L streams on one NIC
    piece = math.ceil(n / per_host)
    ring = all_reduce_ring.cost(hosts, piece, shared)
    rd = all_reduce_recursive_doubling.cost(hosts, piece, shared)
    return min(ring, rd), rd < ring


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, TwoLevelLink) or link.hosts < 2 or link.per_host < 1:
        return math.inf
    if p != link.hosts * link.per_host:  # a sub-group: its layout is not the world's
        return math.inf
    L, intra = link.per_host, link.intra
    f = (L - 1) / L
    local = 2 * (L - 1) * intra.alpha + 2 * f * n * intra.beta + f * n * link.gamma
    return local + _inter(link.hosts, L, n, link)[0]


def supports(p: int, n: int, topo: Topology) -> bool:
    return p > 1 and topo.uniform_hosts(p) > 0


def run(
    ctx: OpContext, arr: np.ndarray, kern: Kernel, op: ReduceOp, dtype: DType, seg: int
) -> None:
    hosts = [list(h) for h in ctx.topo.hosts]
    L = ctx.topo.uniform_hosts(ctx.size)
    if not L:
        raise UnsupportedError(f"{ctx.name}: all_reduce algorithm 'hierarchical' needs {NEEDS}")
    mine = next(h for h in hosts if ctx.rank in h)
    j = mine.index(ctx.rank)
    local = SubContext(ctx, mine, 0)
    cross = SubContext(ctx, [h[j] for h in hosts], INTER_TAGS)
    blocks = [arr[o : o + k] for o, k in chunks(len(arr), L)]
    tag = reduce_scatter_blocks(local, blocks, None, kern, seg, inplace=True)
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op  # AVG divides once, by p, below
    two = ctx.topo.link
    use_rd = isinstance(two, TwoLevelLink) and _inter(len(hosts), L, arr.nbytes, two)[1]
    algo = all_reduce_recursive_doubling if use_rd else all_reduce_ring
    algo.run(cross, blocks[j], kern, inner, dtype, seg)
    if op is ReduceOp.AVG:
        finalize_average(blocks[j], dtype, ctx.size)
    allgather_blocks(local, blocks, seg, tag0=tag)
