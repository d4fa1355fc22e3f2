"""Where each key lives: a pure, deterministic function of its name, size and the servers.

A key has a *home* server, ``crc32(name) % num_servers``, which holds its metadata
and decides who initialises it. A key of at least ``split_bytes`` bytes (and at
least one element per server) is split into ``num_servers`` contiguous pieces of
its flattened elements, piece i on server ``(home + i) % num_servers``, so its
traffic is spread over every server; a smaller key is one piece on its home.
Every worker computes the same placement with no communication.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["DEFAULT_SPLIT_BYTES", "Piece", "home", "layout"]

#: keys of this many bytes or more are split over all servers (MXNet's bound is 1e6 elements)
DEFAULT_SPLIT_BYTES = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, stop)`` of a key's flattened value, held by server ``server``."""

    index: int  # piece number within the key
    server: int  # server index (0 .. num_servers - 1)
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


def home(key: str, num_servers: int) -> int:
    """The server index that holds ``key``'s metadata."""
    return zlib.crc32(key.encode("utf-8")) % num_servers


def layout(
    key: str, count: int, itemsize: int, num_servers: int, split_bytes: int
) -> tuple[Piece, ...]:
    """The pieces of a key of ``count`` elements of ``itemsize`` bytes."""
    h = home(key, num_servers)
    if num_servers == 1 or count * itemsize < split_bytes or count < num_servers:
        return (Piece(0, h, 0, count),)
    base, extra = divmod(count, num_servers)
    pieces, start = [], 0
    for i in range(num_servers):
        n = base + (1 if i < extra else 0)
        pieces.append(Piece(i, (h + i) % num_servers, start, start + n))
        start += n
    return tuple(pieces)
