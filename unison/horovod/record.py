"""Cycle messages as fixed-size records, gathered with one small collective.

In steady state (every rank's last cycle was pure response-cache traffic) the next
cycle's messages are not sent point to point: every rank packs its message into
one record of :data:`RECORD_BYTES` and one ``all_gather`` on the set's data group
(run on the caller's thread where the group's engine offers that) hands every rank
every record.
Decoded, the records are the very messages the point-to-point path delivers, so the
decision code is the same. A message that does not fit (new requests, the stall
inspector's shutdowns, many inline bytes) is sent point to point as before and its
record only says so (:data:`P2P`); every rank then waits for that message.

Layout (little-endian): flags (u8), 3 spare bytes, the cycle number (u32), the
length of the cache bits (u16), the number of inline parts (u16); the bits; per part
the cache id (u32), its length (u32) and its bytes. An inline part is named by the
cache id of its tensor: every rank's cache holds the same ids at a cycle's start.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..comm.api import Group, all_gather_into_tensor
from ..errors import UnisonError
from .cache import ResponseCache
from .errors import HorovodInternalError

__all__ = ["BYE", "P2P", "RECORD_BYTES", "STEADY", "GatheredCycles", "decode", "encode", "marker"]

RECORD_BYTES = 1024
PRESENT, P2P, BYE, STEADY = 1, 2, 4, 8
_HEAD = struct.Struct("<B3xIHH")
_PART = struct.Struct("<II")


def encode(msg: tuple[Any, ...], cache: ResponseCache, out: np.ndarray) -> bool:
    """Pack ``msg`` (``("C", k, bits, fresh, force, parts, steady)``) into ``out``;
    False when it does not fit (new requests, stall shutdowns, too many bytes)."""
    _, k, bits, fresh, force, parts, steady = msg
    if fresh or force:
        return False
    cids: list[tuple[int, bytes]] = []
    size = _HEAD.size + len(bits)
    for name, data in parts.items():
        cid = cache.id_of(name)
        if cid is None:
            return False
        cids.append((cid, data))
        size += _PART.size + len(data)
    if size > len(out) or len(bits) > 0xFFFF:
        return False
    buf = out.data
    flags = PRESENT | (STEADY if steady else 0)
    _HEAD.pack_into(buf, 0, flags, k & 0xFFFFFFFF, len(bits), len(cids))
    at = _HEAD.size
    out[at : at + len(bits)] = np.frombuffer(bits, np.uint8)
    at += len(bits)
    for cid, data in cids:
        _PART.pack_into(buf, at, cid, len(data))
        at += _PART.size
        out[at : at + len(data)] = np.frombuffer(data, np.uint8)
        at += len(data)
    return True


def marker(out: np.ndarray, k: int, flags: int) -> None:
    """A record that carries no message: ``P2P`` (sent point to point) or ``BYE``."""
    _HEAD.pack_into(out.data, 0, PRESENT | flags, k & 0xFFFFFFFF, 0, 0)


def decode(rec: np.ndarray, k: int, cache: ResponseCache) -> tuple[int, tuple[Any, ...] | None]:
    """(flags, the message) of one gathered record; the message is None for a marker."""
    flags, kk, nbits, nparts = _HEAD.unpack_from(rec.data, 0)
    if not flags & PRESENT or kk != k & 0xFFFFFFFF:
        raise ValueError(f"cycle record for cycle {kk} (flags {flags}) in cycle {k}")
    if flags & (P2P | BYE):
        return flags, None
    at = _HEAD.size
    bits = rec[at : at + nbits].tobytes()
    at += nbits
    parts: dict[str, bytes] = {}
    for _ in range(nparts):
        cid, n = _PART.unpack_from(rec.data, at)
        at += _PART.size
        parts[cache.get(cid).name] = rec[at : at + n].tobytes()
        at += n
    return flags, ("C", k, bits, [], {}, parts, bool(flags & STEADY))


def _empty(k: int) -> tuple[Any, ...]:
    return ("C", k, b"", [], {}, {}, False)


class GatheredCycles:
    """One process set's gathered cycles: this rank's record and everyone's.

    ``ok``: the set's data group runs small blocking collectives on the caller's thread
    (a set of one never gathers). ``enabled`` (tests, benchmarks): False keeps every
    cycle point to point; ranks need not agree, a rank that says "not steady" keeps its
    peers off it too."""

    def __init__(self, group: Group, size: int, me: int) -> None:
        self.group = group
        self.size = size
        self.me = me
        self.ok = size > 1 and group.caller_thread_collectives
        self.enabled = True
        self.rec = np.zeros(RECORD_BYTES, np.uint8)
        self.view = self.rec.data  # this rank's record, for struct.pack_into
        self.everyone = np.zeros(RECORD_BYTES * size, np.uint8)  # rank order

    def steady(self, msg: tuple[Any, ...], cache: ResponseCache) -> bool:
        """Whether ``msg`` may be gathered (it is packed into :attr:`rec` if so)."""
        return self.ok and self.enabled and encode(msg, cache, self.rec)

    def pack(self, msg: tuple[Any, ...], cache: ResponseCache) -> bool:
        return encode(msg, cache, self.rec)

    def mark(self, k: int, p2p: bool = False, bye: bool = False) -> None:
        marker(self.rec, k, (P2P if p2p else 0) | (BYE if bye else 0))

    def exchange(
        self, k: int, cache: ResponseCache, ranks: list[int]
    ) -> tuple[dict[int, Any], list[int], list[int]]:
        """Gather every rank's record of cycle ``k``: (the peers' messages, the set
        ranks whose message comes point to point, the set ranks that said goodbye)."""
        self.gather(k, ranks)
        return self.decode_all(k, cache, ranks)

    def gather(self, k: int, ranks: list[int]) -> None:
        """The collective of cycle ``k``: every rank's record into :attr:`everyone`."""
        try:
            all_gather_into_tensor(self.everyone, self.rec, group=self.group)
        except UnisonError as exc:
            lost = tuple(getattr(exc, "ranks", ()) or ())
            who = f"ranks {list(lost)}" if lost else "the peers"
            raise HorovodInternalError(
                f"negotiation cycle {k} of rank {ranks[self.me]} with {who} failed: {exc}",
                ranks=lost,
            ) from exc

    def decode_all(
        self, k: int, cache: ResponseCache, ranks: list[int]
    ) -> tuple[dict[int, Any], list[int], list[int]]:
        """The gathered records decoded: as :meth:`exchange` returns them."""
        msgs: dict[int, Any] = {}
        p2p: list[int] = []
        bye: list[int] = []
        n = RECORD_BYTES
        for r in range(self.size):
            if r == self.me:
                continue
            try:
                flags, msg = decode(self.everyone[r * n : (r + 1) * n], k, cache)
            except (ValueError, KeyError) as exc:
                raise HorovodInternalError(
                    f"rank {ranks[r]} sent a malformed negotiation record: {exc}",
                    ranks=(ranks[r],),
                ) from None
            if flags & BYE:
                bye.append(r)
                msgs[r] = _empty(k)
            elif msg is None:
                p2p.append(r)
            else:
                msgs[r] = msg
        return msgs, p2p, bye
