"""Adasum: scale-invariant combination of gradients (Maleki et al., 2020).

Two vectors combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b``: orthogonal
gradients add, parallel ones average. Ranks combine pairwise up a binary tree in
rank order (distance 1, then 2, 4, ...), the same tree Horovod's recursive
vector-halving follows, so every rank computes the identical result. Pure numpy,
in double precision.
"""

from __future__ import annotations

import numpy as np

__all__ = ["adasum_combine", "adasum_pair"]


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float(np.dot(a, b))
    na, nb = float(np.dot(a, a)), float(np.dot(b, b))
    ca = 1.0 - dot / (2 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def adasum_combine(vectors: list[np.ndarray]) -> np.ndarray:
    level = list(vectors)
    while len(level) > 1:
        nxt = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]
