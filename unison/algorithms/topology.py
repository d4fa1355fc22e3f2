"""What an algorithm may rely on about the group it runs for: the link, the shared
slots, the host layout. Identical on every rank of the group (built from what every
rank agreed on at set-up), so every rank's ``supports()`` and ``cost()`` agree.

The runtime makes one per group; tools (``unison simulate``, tests) make one from a
link alone with :meth:`Topology.of`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..link import Link, SharedLink, TwoLevelLink

if TYPE_CHECKING:
    from ..transport.arena import Arena

__all__ = ["Topology"]


@dataclass(frozen=True, eq=False)  # identity hash: the selector caches per topology
class Topology:
    """``link``: the cost model; ``shared``: the group may use the shared-memory slots
    (every rank on one host, and the group runs its operations one at a time in the same
    order on every rank: the world, or a sub-group with its own slot region and arena);
    ``arena``: those slots, where mapped;
    ``hosts``: the group's ranks by host, hosts in order of their lowest rank."""

    link: Link
    shared: bool = False
    arena: Arena | None = None
    hosts: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, link: Link, p: int = 0) -> Topology:
        """The topology a link describes (for tools): a :class:`SharedLink` is one host
        with shared slots; a :class:`TwoLevelLink` gives ``hosts`` × ``per_host``."""
        hosts: tuple[tuple[int, ...], ...] = ()
        if isinstance(link, TwoLevelLink) and link.hosts >= 2 and link.per_host >= 1:
            L = link.per_host
            hosts = tuple(tuple(range(h * L, (h + 1) * L)) for h in range(link.hosts))
        return cls(link, shared=isinstance(link, SharedLink), hosts=hosts)

    def uniform_hosts(self, p: int) -> int:
        """Ranks per host if the group's ``p`` ranks fill 2 or more hosts evenly, else 0."""
        if len(self.hosts) < 2 or sum(len(h) for h in self.hosts) != p:
            return 0
        sizes = {len(h) for h in self.hosts}
        return sizes.pop() if len(sizes) == 1 else 0
