"""Choose an algorithm per call by predicted cost, as NCCL's tuner does.

Every algorithm module has ``cost(p, n, link)``, ``supports(p, n, topo)`` (eligibility,
from the group's :class:`~.topology.Topology` alone) and ``NEEDS`` (what it needs, for
the refusal); the selector evaluates the eligible ones on the group's link and takes
the cheapest. ``UNISON_ALGO="all_reduce:ring"`` forces one (the older
spellings ``allreduce``, ``allgather``, ``alltoall`` are accepted too); a forced algorithm that
cannot serve a call raises :class:`UnsupportedError` saying so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

from ..errors import UnsupportedError
from ..link import Link
from ..log import get_logger
from . import (
    all_gather_cma,
    all_gather_ring,
    all_gather_shm,
    all_reduce_hierarchical,
    all_reduce_recursive_doubling,
    all_reduce_ring,
    all_reduce_shm,
    all_reduce_shm_one,
    all_to_all_pairwise,
    barrier_dissemination,
    broadcast_binomial,
    broadcast_shm,
    gather_scatter_linear,
    reduce_binomial,
    reduce_scatter_ring,
    reduce_scatter_shm,
)
from .topology import Topology

__all__ = ["ALIASES", "REGISTRY", "Choice", "choose", "table"]

log = get_logger("select")

#: collective → candidate algorithm modules (name, cost, supports, run).
REGISTRY: dict[str, tuple[ModuleType, ...]] = {
    "all_reduce": (
        all_reduce_ring,
        all_reduce_recursive_doubling,
        all_reduce_shm,
        all_reduce_shm_one,
        all_reduce_hierarchical,
    ),
    "broadcast": (broadcast_binomial, broadcast_shm),
    "reduce": (reduce_binomial,),
    "all_gather": (all_gather_ring, all_gather_shm, all_gather_cma),
    "reduce_scatter": (reduce_scatter_ring, reduce_scatter_shm),
    "all_to_all": (all_to_all_pairwise,),
    "gather": (gather_scatter_linear,),
    "scatter": (gather_scatter_linear,),
    "barrier": (barrier_dissemination,),
}

#: older spellings of collective names, still accepted (``UNISON_ALGO=allreduce:ring``).
ALIASES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "alltoall": "all_to_all",
}


@dataclass(frozen=True)
class Choice:
    collective: str
    name: str
    module: ModuleType
    predicted: float
    forced: bool


def _names(collective: str) -> list[str]:
    return [m.NAME for m in REGISTRY[collective]]


def choose(
    collective: str, p: int, nbytes: int, topo: Topology | Link, overrides: Mapping[str, str]
) -> Choice:
    """The algorithm for one call: the forced one (it must be eligible), else the
    cheapest eligible one. ``topo``: the group's topology (a bare link: :meth:`Topology.of`)."""
    collective = ALIASES.get(collective, collective)
    if isinstance(topo, Link):
        topo = Topology.of(topo, p)
    forced = overrides.get(collective)
    if forced is not None:
        for mod in REGISTRY[collective]:
            if mod.NAME == forced:
                if not mod.supports(p, nbytes, topo):
                    raise UnsupportedError(
                        f"UNISON_ALGO forces {collective}:{forced}, which cannot serve "
                        f"{p} ranks x {nbytes} bytes here: it needs {mod.NEEDS}"
                    )
                return _forced(collective, mod, p, nbytes, topo)
        raise UnsupportedError(
            f"UNISON_ALGO names {collective}:{forced}; known {collective} algorithms: "
            f"{', '.join(_names(collective))}"
        )
    return _cheapest(collective, p, nbytes, topo)


@functools.lru_cache(maxsize=4096)
def _forced(collective: str, mod: ModuleType, p: int, nbytes: int, topo: Topology) -> Choice:
    """A forced choice's prediction, remembered as :func:`_cheapest` remembers its choice
    (a direct algorithm's cost plans its rounds: microseconds a call otherwise)."""
    link = topo.link.at(nbytes, p)
    t = link.overhead + mod.cost(p, nbytes, link)
    return Choice(collective, mod.NAME, mod, t, True)


@functools.lru_cache(maxsize=4096)
def _cheapest(collective: str, p: int, nbytes: int, topo: Topology) -> Choice:
    best: Choice | None = None
    link = topo.link.at(nbytes, p)  # rates by size; α with the wake-ups of p ranks
    for mod in REGISTRY[collective]:
        if mod.supports(p, nbytes, topo):
            t = link.overhead + mod.cost(p, nbytes, link)
            if best is None or t < best.predicted:
                best = Choice(collective, mod.NAME, mod, t, False)
    assert best is not None, collective
    log.debug(
        "%s p=%d n=%d -> %s (%.1f us)", collective, p, nbytes, best.name, best.predicted * 1e6
    )
    return best


def table(
    p: int, link: Link, sizes: list[int], fmt: Callable[[float], str] = lambda t: f"{t * 1e6:.1f}"
) -> str:
    """The choice table (predicted µs per algorithm) for logs and ``unison info``."""
    lines = []
    topo = Topology.of(link, p)
    for coll, mods in REGISTRY.items():
        for n in sizes:
            cells = [f"{m.NAME}={fmt(m.cost(p, n, link.at(n, p)))}" for m in mods]
            pick = _cheapest(coll, p, n, topo).name
            lines.append(f"{coll:15s} {n:>12d}B  {' '.join(cells)}  -> {pick}")
    return "\n".join(lines)
