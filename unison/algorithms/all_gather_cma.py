"""Single-copy all-gather on one host: each rank reads every peer's block straight out of
the peer's memory (cross-memory attach, :mod:`unison.transport.cma`).

Phases: every rank publishes its process id and the address of its own block
(already in place in its output) in its slot header; sync; every rank copies each
peer's block into its output with ``process_vm_readv`` (one copy per byte, where
the slot algorithm :mod:`.all_gather_shm` makes two: into a slot and out of it);
sync, so no rank returns — and may overwrite its output — while a peer still reads
it. Whether every rank may read every other (the kernel's ptrace rule) is learnt
once, on the first call: each rank reads its peers' slot headers through the
kernel and compares them with the mapped copy, then all ranks share the verdict
in their headers; if any pair cannot, every rank runs :mod:`.all_gather_shm`
instead, on every call. Blocks that are not contiguous (a list of outputs) take
the same way out for that call, agreed through the headers too.

Cost (n bytes gathered in total): 2 syncs + ((p−1)/p)·n·m + the own block into the
output (:func:`.all_gather_ring.own_copy`), m the measured
seconds per byte of ``process_vm_readv`` (:class:`SharedLink` ``cma``; 0, not
measured: never chosen unless forced).
Preconditions: every rank on one host (a :class:`SharedLink`), the world group,
Linux with ``process_vm_readv``.
Reference: OpenMPI's ``smsc/cma`` single-copy mechanism.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Sequence

import numpy as np

from ..errors import PeerLostError
from ..link import Link, SharedLink, crowding
from ..transport import cma
from ..transport.arena import Arena
from . import all_gather_ring, all_gather_shm
from ._context import OpContext
from .shm_arena import arena_of, sync, sync_cost
from .topology import Topology

__all__ = ["NAME", "NEEDS", "cost", "run", "supports"]

NAME = "cma"
NEEDS = (
    "every rank on one host with shared memory (not UNISON_TRANSPORT=tcp, not across "
    "hosts), the world group, and Linux's process_vm_readv"
)

# header words (int64) in each slot
_TOKEN, _PID, _HEAD_ADDR, _VERDICT, _ADDR, _NBYTES, _OK = range(7)
_YES, _NO = 1, 2


def cost(p: int, n: int, link: Link) -> float:
    if not isinstance(link, SharedLink) or p < 2 or link.cma <= 0:
        return math.inf
    read = crowding(p, link) * (p - 1) / p * n * link.cma
    return 2 * sync_cost(p, link) + read + all_gather_ring.own_copy(p, n, link)


def supports(p: int, n: int, topo: Topology) -> bool:
    return topo.shared and cma.available()


def _learn(ctx: OpContext, arena: Arena) -> bool:
    """Whether every rank may read every other's memory (the same answer on all ranks)."""
    me = ctx.ranks[ctx.rank]
    mine = arena.heads[me]
    mine[_TOKEN] = int.from_bytes(secrets.token_bytes(7), "little")
    mine[_PID] = os.getpid()
    mine[_HEAD_ADDR] = mine.ctypes.data
    sync(ctx, 10)
    ok = True
    for q in ctx.ranks:
        if q == me:
            continue
        seen = arena.heads[q]
        got = np.zeros(1, np.int64)
        try:
            cma.read_from(int(seen[_PID]), int(seen[_HEAD_ADDR]) + 8 * _TOKEN, got)
        except cma.CmaError:
            ok = False
            continue
        ok = ok and int(got[0]) == int(seen[_TOKEN])
    mine[_VERDICT] = _YES if ok else _NO
    sync(ctx, 11)
    return all(int(arena.heads[q][_VERDICT]) == _YES for q in ctx.ranks)


def run(ctx: OpContext, blocks: Sequence[np.ndarray], seg: int) -> None:
    p = ctx.size
    if p == 1 or len({b.nbytes for b in blocks}) != 1:
        all_gather_shm.run(ctx, blocks, seg)
        return
    arena = arena_of(ctx, NAME)
    if arena.cma is None:
        arena.cma = _learn(ctx, arena)
    if not arena.cma:
        all_gather_shm.run(ctx, blocks, seg)
        return
    me, glob = ctx.rank, ctx.ranks
    head = arena.heads[glob[me]]
    own = blocks[me]
    head[_PID] = os.getpid()
    head[_ADDR] = own.ctypes.data
    head[_NBYTES] = own.nbytes
    head[_OK] = int(all(b.flags.c_contiguous for b in blocks))
    sync(ctx, 0)
    if not all(int(arena.heads[glob[q]][_OK]) for q in range(p)):
        ctx.tag_base += 1 << 16  # the slot algorithm's steps must not reuse step 0
        all_gather_shm.run(ctx, blocks, seg)
        return
    for q in range(p):
        if q == me or not blocks[q].nbytes:
            continue
        theirs = arena.heads[glob[q]]
        try:
            cma.read_from(int(theirs[_PID]), int(theirs[_ADDR]), blocks[q])
        except cma.CmaError as exc:
            raise PeerLostError(
                f"{ctx.name}: rank {glob[me]} could not read rank {glob[q]}'s block ({exc})",
                op=ctx.op.label,
                seq=ctx.seq,
                group=ctx.group_id,
                ranks=(glob[q],),
            ) from None
    sync(ctx, 1)
