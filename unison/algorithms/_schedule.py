"""Pure schedules: who talks to whom, in which step. No I/O; tested alone."""

from __future__ import annotations

__all__ = [
    "binomial_children",
    "binomial_parent",
    "chunks",
    "dissemination_peers",
    "pof2_floor",
    "recursive_doubling_plan",
    "ring_neighbors",
    "segments",
]


def ring_neighbors(rank: int, size: int) -> tuple[int, int]:
    """(left, right): receive from left, send to right."""
    return (rank - 1) % size, (rank + 1) % size


def chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` contiguous (offset, length), sizes differ by ≤ 1."""
    base, extra = divmod(count, parts)
    out, off = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((off, n))
        off += n
    return out


def segments(count: int, seg: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into pieces of at most ``seg`` (at least one piece)."""
    seg = max(1, seg)
    if count <= seg:
        return [(0, count)]
    return [(off, min(seg, count - off)) for off in range(0, count, seg)]


def pof2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def recursive_doubling_plan(rank: int, size: int) -> tuple[str, int, list[int]]:
    """MPICH's plan for non-powers of two.

    Returns (role, partner, exchange peers): role 'fold' ranks send their data to
    ``partner`` and wait for the result; 'core' ranks first absorb a folded
    partner (if partner >= 0), exchange with each peer in turn, then return the
    result to the partner.
    """
    pof2 = pof2_floor(size)
    rem = size - pof2
    if rank < 2 * rem:
        if rank % 2 == 0:
            return "fold", rank + 1, []
        partner, newrank = rank - 1, rank // 2
    else:
        partner, newrank = -1, rank - rem
    peers = []
    mask = 1
    while mask < pof2:
        newdst = newrank ^ mask
        peers.append(newdst * 2 + 1 if newdst < rem else newdst + rem)
        mask <<= 1
    return "core", partner, peers


def binomial_parent(rank: int, size: int, root: int) -> int:
    """Parent in the binomial tree rooted at ``root`` (-1 for the root)."""
    vr = (rank - root) % size
    if vr == 0:
        return -1
    mask = 1
    while not vr & mask:
        mask <<= 1
    return ((vr - mask) + root) % size


def binomial_children(rank: int, size: int, root: int) -> list[int]:
    """Children, largest subtree first (the order a broadcast sends in)."""
    vr = (rank - root) % size
    mask = 1
    while mask < size and not vr & mask:
        mask <<= 1
    out = []
    mask >>= 1
    while mask > 0:
        if vr + mask < size:
            out.append((vr + mask + root) % size)
        mask >>= 1
    return out


def dissemination_peers(rank: int, size: int) -> list[tuple[int, int]]:
    """Per round (send_to, recv_from) of the dissemination barrier."""
    out, dist = [], 1
    while dist < size:
        out.append(((rank + dist) % size, (rank - dist) % size))
        dist <<= 1
    return out
