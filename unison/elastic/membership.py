"""Pure planning of an elastic world: which new workers to start, and who gets which rank.

Rules (Horovod's contract): hosts keep their order, new hosts come last, so the
oldest workers keep the lowest ranks and rank 0 of a new world is a worker that held
the state before the reset (it re-syncs everyone else). A host's ranks are
contiguous, so ``local_rank``/``cross_rank`` mean what they mean in Horovod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .rendezvous import Assignment

__all__ = ["Member", "assign", "plan"]


@dataclass
class Member:
    """A live worker: its id, its host and its rank in the last round (None: new)."""

    id: str
    host: str
    rank: int | None = None


def plan(
    members: Sequence[Member],
    hosts: Mapping[str, int],
    max_np: int | None,
    host_order: Sequence[str] = (),
) -> list[str]:
    """The hosts of the workers to start: free slots of ``hosts`` (available, not
    blacklisted) in ``host_order`` then in discovery order, up to ``max_np`` workers."""
    used: dict[str, int] = {}
    for m in members:
        used[m.host] = used.get(m.host, 0) + 1
    order = [h for h in host_order if h in hosts] + [h for h in hosts if h not in host_order]
    room = None if max_np is None else max_np - len(members)
    out: list[str] = []
    for h in order:
        for _ in range(max(0, hosts[h] - used.get(h, 0))):
            if room is not None and len(out) >= room:
                return out
            out.append(h)
    return out


def assign(members: Sequence[Member]) -> dict[str, Assignment]:
    """Ranks for ``members``: hosts ordered by their lowest previous rank (hosts of new
    workers only last), previous ranks first within a host."""
    big = 1 << 62
    first: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(members):
        key = (m.rank if m.rank is not None else big, i)
        if m.host not in first or key < first[m.host]:
            first[m.host] = key
    hosts = sorted(first, key=lambda h: first[h])
    ordered: list[Member] = []
    for h in hosts:
        mine = [(i, m) for i, m in enumerate(members) if m.host == h]
        mine.sort(key=lambda im: (im[1].rank is None, im[1].rank or 0, im[0]))
        ordered.extend(m for _, m in mine)
    size = len(ordered)
    out: dict[str, Assignment] = {}
    for rank, m in enumerate(ordered):
        local = [x for x in ordered if x.host == m.host]
        out[m.id] = Assignment(
            rank=rank,
            size=size,
            local_rank=local.index(m),
            local_size=len(local),
            cross_rank=hosts.index(m.host),
            cross_size=len(hosts),
            host=m.host,
        )
    return out
