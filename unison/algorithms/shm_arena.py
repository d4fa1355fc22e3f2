"""The shared slots that direct shared-memory collectives read and reduce in place.

When every rank of the job shares one host, each rank's segment holds a *slot*
that every other rank has mapped too. The direct algorithms
(:mod:`.all_reduce_shm`, :mod:`.reduce_scatter_shm`, :mod:`.all_gather_shm`,
:mod:`.broadcast_shm`) work in rounds: a rank writes its part of a chunk into
half of its slot, all ranks synchronise (a zero-byte message to every peer, so
deadlines, aborts and lost peers behave as in every other algorithm), then each
reads — and reduces — straight out of its peers' slots.

Slot reuse: round ``r`` (counted over the whole job, identical on every rank)
uses half ``r % 2``. A rank writes half ``h`` in round ``r`` only after every
peer's synchronisation message of round ``r − 1``, which that peer sends after
it finished reading round ``r − 2`` — the last use of half ``h``. So one
synchronisation per phase suffices and per-rank shared memory stays one slot,
whatever the message size.

Round sizes come from the link model (:func:`round_plan`, :func:`pipeline_plan`):
long enough that a round's synchronisation and Python work stay a small share of it,
short enough — for operations that no longer fit the cache — that a round's chunk and
slot halves stay cached between the copy in and the reduction. A round touches only
the pages it uses, so the resident shared memory of a large operation is what its
rounds reach (2 × p round-lengths per rank), not the whole slot.

The slots themselves (:class:`~unison.transport.arena.Arena`: mapped memory and the
round counter) are the transport's; this module plans the rounds. Only the world
group uses the slots (its operations run one at a time, in the
same order on every rank): a group's :class:`~.topology.Topology` has them (and the
direct algorithms' ``supports()`` says yes) only for the world of a one-host job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..errors import UnsupportedError
from ..link import SLOT_BYTES, Link, SharedLink, crowding, sync_at
from ..transport.arena import Arena
from ._context import OpContext
from .topology import Topology

__all__ = [
    "SHM_NEEDS",
    "SLOT_BYTES",
    "SharedLink",
    "arena_of",
    "crowding",
    "in_cache",
    "pipeline_bytes",
    "pipeline_plan",
    "round_plan",
    "round_bytes",
    "round_fixed",
    "round_for",
    "warm_round",
    "rounds",
    "sync",
    "sync_cost",
]

_EMPTY = np.empty(0, np.uint8)
#: what every direct shared-memory algorithm needs (its ``NEEDS``, for UNISON_ALGO errors)
SHM_NEEDS = (
    "every rank on one host with shared memory (not UNISON_TRANSPORT=tcp, not across "
    "hosts) and the world group or a sub-group with its own arena (ids below "
    "UNISON_GROUP_SLOTS, UNISON_GROUP_ARENA_BYTES > 0)"
)


#: a round's synchronisation may cost at most this share of the round's copies and
#: reductions (rounds no longer than that keep a large operation's slot use, and so its
#: resident memory, small: the pages a round never reaches are never touched)
SYNC_SHARE = 1 / 32
#: the shortest round (a page multiple): below it the Python work of a round dominates
MIN_ROUND = 64 << 10
_PAGE = 4096


def _half(link: Link) -> int:
    return link.half if isinstance(link, SharedLink) else SLOT_BYTES // 2


def in_cache(p: int, link: Link) -> SharedLink | None:
    """An out-of-cache operation's link at the rates of rounds short enough to keep their
    working set in the cache (:func:`warm_round`): the user's bytes still stream from
    memory once (half a cold copy: its read), the slots and the chunk just read stay in
    the cache (in-cache reduction, in-cache other half of the copy). On a 2-core
    host: 1.12e-10 s/byte for the all-reduce's copy and reduction, this model
    1.2e-10, the cold rates 2.07e-10. None where the link is not out-of-cache, the
    rates are unknown, or ``p`` ranks outnumber the cores: ranks sharing a core evict
    each other's rounds, and the extra rounds' syncs each wait for a context switch
    (counted, np=4 on 2 cores, 256 MiB, under load: 408 KiB rounds 40 % slower)."""
    if not isinstance(link, SharedLink) or link.warm <= 0 or link.warm_copy <= 0:
        return None
    if crowding(p, link) > 1:
        return None
    copy = (link.warm_copy + link.copy) / 2
    return replace(link, copy=copy, gamma=link.warm_gamma or link.gamma)


def warm_round(p: int, link: Link) -> int:
    """The longest round whose working set stays in the cache: each of the ``p`` ranks
    touches its chunk and ``p`` slot halves of the round's length, so p·(p+1) rounds'
    bytes must fit the working set the calibration still priced at in-cache rates
    (:attr:`SharedLink.warm`; half a slot where unknown). For example
    (one process, the all-reduce's copy in and reduction over 256 MiB, CPU time): 4 MiB
    rounds 61 ms, 2 MiB 34 ms, 1 MiB and less 30 ms: a round that outgrows the cache
    reads its chunk and slots from memory twice."""
    half = _half(link)
    warm = link.warm if isinstance(link, SharedLink) else 0
    if warm <= 0:
        return half
    return max(min(MIN_ROUND, half), min(half, warm // (p * (p + 1)) // _PAGE * _PAGE))


def round_fixed(p: int, link: Link, syncs: int = 1) -> float:
    """Seconds a round costs whatever its length: its ``syncs`` synchronisations plus its
    own Python work (slicing the slots, a copy and a kernel call: about one message's
    Python work at one end, ``(α − hop) / 2`` of a calibrated link, a few µs on a
    typical host)."""
    py = (link.alpha - link.hop) / 2 if 0 < link.hop < link.alpha else 0.0
    return syncs * sync_cost(p, link) + py


def _fit(fixed: float, per_byte: float, cap: int) -> int:
    if fixed <= 0 or per_byte <= 0:
        return cap
    want = int(fixed / (SYNC_SHARE * per_byte)) // _PAGE * _PAGE
    return max(min(MIN_ROUND, cap), min(cap, want))


def round_plan(
    p: int, link: Link, per_byte: Callable[[Link], float], syncs: int = 1
) -> tuple[int, float]:
    """Bytes per round and seconds per byte of work for a direct algorithm whose ranks
    do the same work each round (all-reduce, all-gather, reduce-scatter).

    Rounds are the fewest bytes whose work (``per_byte(link)``, as the algorithm's
    ``cost()`` prices it) makes the round's fixed cost (:func:`round_fixed`) at most
    :data:`SYNC_SHARE` of its time, at most half a slot, whole pages. An out-of-cache
    operation may instead take rounds that fit the cache (:func:`warm_round`) at the
    in-cache rates, when those rates save more than the extra rounds cost. Every rank
    computes the same plan (one link model)."""
    fixed = round_fixed(p, link, syncs)
    pb = per_byte(link)
    r = _fit(fixed, pb, _half(link))
    hot = in_cache(p, link)
    if hot is not None:
        hpb = per_byte(hot)
        rw = _fit(fixed, hpb, warm_round(p, link))
        if fixed / rw + hpb < fixed / r + pb:
            return rw, hpb
    return r, pb


def pipeline_plan(p: int, n: int, link: Link) -> tuple[int, float]:
    """Bytes per round and seconds per byte copied for a pipelined copy through the
    slots (broadcast: the root fills one half while the readers empty the other): with
    k rounds of b = n/k bytes the copies take (n·crowding + b)·c and the rounds k·f
    (f: :func:`round_fixed`), least at k = √(n·c / f); at most half a slot, whole
    pages; an out-of-cache operation may take cache-sized rounds at in-cache rates."""

    def fit(lk: Link, cap: int) -> tuple[int, float]:
        f, c = round_fixed(p, lk), lk.copy
        if f <= 0 or c <= 0 or n <= MIN_ROUND:
            b = cap
        else:
            k = max(1, round(math.sqrt(n * c / f)))
            per = -(-n // k)
            b = -(-per // _PAGE) * _PAGE
            b = max(min(MIN_ROUND, cap), min(cap, b))
        b = min(b, max(n, 1))
        t = (crowding(p, lk) * n + b) * c + f * math.ceil(n / b)
        return b, t

    b, t = fit(link, _half(link))
    c = link.copy
    hot = in_cache(p, link)
    if hot is not None:
        bw, tw = fit(hot, warm_round(p, link))
        if tw < t:
            b, c = bw, hot.copy
    return b, c


def round_bytes(p: int, link: Link, per_byte: float) -> int:
    """:func:`round_plan`'s bytes for a fixed ``per_byte`` (no cache alternative)."""
    return _fit(round_fixed(p, link), per_byte, _half(link))


def pipeline_bytes(p: int, n: int, link: Link) -> int:
    """:func:`pipeline_plan`'s bytes per round."""
    return pipeline_plan(p, n, link)[0]


@functools.lru_cache(maxsize=1024)
def round_for(round_size: Callable[[int, int, Link], int], topo: Topology, p: int, n: int) -> int:
    """``round_size(p, n, link)`` on the group's link for ``n`` bytes (rates by size, as the
    selector prices the call), remembered per topology: a round size costs one lookup."""
    return round_size(p, n, topo.link.at(n, p))


def rounds(n: int, link: Link, step: int = 0) -> int:
    """Rounds of an operation on ``n`` bytes, ``step`` bytes a round (0: half a slot)."""
    return max(1, math.ceil(n / (step or _half(link))))


def sync_cost(p: int, link: Link) -> float:
    """Seconds of one :func:`sync` of ``p`` ranks under ``link``: a barrier on the shared
    sequence slots (every rank publishes once and reads the others; the measured
    barrier, :func:`unison.link.sync_at`, which grows with ranks per core), else
    2(p−1) zero-byte messages."""
    if isinstance(link, SharedLink) and link.sync > 0:
        return sync_at(p, link)
    return 2 * (p - 1) * link.alpha


def arena_of(ctx: OpContext, algorithm: str) -> Arena:
    """The shared slots of this operation's group (its topology has them exactly when the
    algorithm's ``supports()`` said yes; the selector checked)."""
    arena = ctx.topo.arena
    if arena is None:
        raise UnsupportedError(
            f"{ctx.name}: algorithm {algorithm!r} needs every rank on one host with shared "
            "memory (UNISON_TRANSPORT is tcp, or the ranks span hosts)"
        )
    return arena


def sync(ctx: OpContext, step: int) -> None:
    """Every rank tells every other it reached ``step`` and hears the same from them:
    the barrier the engine gives the operation (:attr:`OpContext.round_barrier`), else
    a zero-byte message to and from every peer."""
    barrier = ctx.round_barrier
    if barrier is not None:
        barrier(ctx, step)
        ctx.all_pairs_checked = True  # every rank compared every rank's signature
        return
    peers = [q for q in range(ctx.size) if q != ctx.rank]
    reqs = [ctx.irecv(q, step, _EMPTY) for q in peers]
    reqs += [ctx.isend(q, step, _EMPTY) for q in peers]
    ctx.wait(*reqs)
    ctx.all_pairs_checked = True  # every frame carried this operation's signature
    ctx.reset_pending()
