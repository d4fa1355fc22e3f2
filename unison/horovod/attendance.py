"""Who has submitted what: the record behind a stalled handle's message.

Every rank sees every rank's cycle message, so any rank (not only the coordinator) can
name the ranks that have not submitted a tensor yet: from the uncached requests by name,
the last cycle's response-cache bits and the ranks that called ``join()``. The engine
updates this record under its lock; :meth:`Attendance.missing` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cache import ResponseCache, bits_to_ids
from .negotiation import RequestKind

__all__ = ["Attendance"]


@dataclass
class Attendance:
    seen: dict[str, set[int]] = field(default_factory=dict)  # name -> set ranks that asked
    joined: set[int] = field(default_factory=set)  # set ranks that called join()
    last_bits: list[bytes] = field(default_factory=list)  # the last cycle's cache bits

    def record(self, msgs: dict[int, Any], size: int) -> None:
        """One cycle's messages (every set rank's)."""
        self.last_bits = [msgs[r][2] for r in range(size)]
        for r in range(size):
            for q in msgs[r][3]:
                if q.kind is RequestKind.JOIN:
                    self.joined.add(r)
                else:
                    self.seen.setdefault(q.name, set()).add(r)

    def decided(self, name: str, join: bool) -> None:
        """``name`` was agreed: nobody is missing from it any more."""
        if join:
            self.joined.clear()
        self.seen.pop(name, None)

    def all_sent(self, bits: bytes, name: str, size: int) -> None:
        """A cycle in which every rank sent the same ``bits`` (naming ``name``) and all of
        it was decided."""
        self.last_bits = [bits] * size
        self.seen.pop(name, None)

    def missing(self, name: str, cache: ResponseCache, size: int) -> list[int] | None:
        """Set ranks that have not submitted ``name`` (None: unknown here)."""
        have = set(self.seen.get(name, ())) | self.joined
        known = name in self.seen
        for r, bits in enumerate(self.last_bits):
            for cid in bits_to_ids(bits):
                try:
                    if cache.get(cid).name == name:
                        have.add(r)
                        known = True
                except KeyError:
                    continue
        return [r for r in range(size) if r not in have] if known else None
