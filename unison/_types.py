"""Small shared types: reduction operators and what counts as a buffer."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["BufferLike", "ReduceOp"]

#: A numpy array or a torch CPU tensor (typed loosely so torch stays optional).
BufferLike = Any


class ReduceOp(enum.IntEnum):
    """Reduction operators, with torch.distributed's names."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7

    @property
    def is_bitwise(self) -> bool:
        return self in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
