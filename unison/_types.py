"""Small shared types: reduction operators, operation codes and signatures, and what
counts as a buffer."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

__all__ = ["BufferLike", "OpCode", "OpSig", "ReduceOp"]

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


class OpCode(enum.IntEnum):
    """The kinds of operation (the code every frame and slot signature carries)."""

    P2P = 1
    BROADCAST = 2
    ALL_REDUCE = 3
    REDUCE = 4
    ALL_GATHER = 5
    GATHER = 6
    SCATTER = 7
    REDUCE_SCATTER = 8
    ALL_TO_ALL = 9
    BARRIER = 10
    OBJECT = 11
    CHECK = 12  # the signature confirmation that follows rooted collectives

    @property
    def label(self) -> str:
        return self.name.lower()


class OpSig(NamedTuple):
    """What operation a frame belongs to, as seen by its sender: its :class:`OpCode`,
    dtype code, :class:`ReduceOp`, root (global rank, -1: none) and element count.

    (NamedTuples, not dataclasses: one is built for every frame received, and tuple
    construction is several times cheaper.)"""

    op: int = 0
    dtype: int = 0
    redop: int = 0
    root: int = -1
    count: int = 0  # type: ignore[assignment]  # shadows tuple.count, deliberately
