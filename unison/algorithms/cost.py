"""The α-β-γ link model the selector evaluates each algorithm's ``cost()`` with."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Link", "TwoLevelLink", "log2ceil"]


@dataclass(frozen=True)
class Link:
    """α: seconds per message; β: seconds per byte moved; γ: seconds per byte reduced."""

    alpha: float = 40e-6
    beta: float = 1 / 1.5e9
    gamma: float = 1 / 4e9


@dataclass(frozen=True)
class TwoLevelLink(Link):
    """A job over several hosts: ``alpha``/``beta`` are the inter-host (slowest) link, as
    every flat algorithm assumes; ``intra`` is the link between ranks of one host.

    ``hosts`` × ``per_host`` ranks, contiguous by host (``per_host`` 0: hosts hold
    different numbers of ranks). Hierarchical algorithms use both levels.
    """

    intra: Link = Link()
    hosts: int = 1
    per_host: int = 0


def log2ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0
