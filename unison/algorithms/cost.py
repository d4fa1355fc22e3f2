"""The α-β-γ link model the selector evaluates each algorithm's ``cost()`` with."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Link", "log2ceil"]


@dataclass(frozen=True)
class Link:
    """α: seconds per message; β: seconds per byte moved; γ: seconds per byte reduced."""

    alpha: float = 40e-6
    beta: float = 1 / 1.5e9
    gamma: float = 1 / 4e9


def log2ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0
