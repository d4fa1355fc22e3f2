"""The response cache: responses seen before, by a small integer id.

Pure logic. Every rank inserts the same responses in the same order, so ids
agree everywhere; a rank then announces a repeated tensor as one bit, and the
bitwise AND of all ranks' bit vectors says which cached tensors are ready
everywhere, with no round trip to the coordinator. Least recently used entries
are evicted at capacity (identically on every rank).
"""

from __future__ import annotations

from collections import OrderedDict

from .negotiation import Response, TensorRequest

__all__ = ["ResponseCache", "and_bits", "bits_to_ids", "ids_to_bits"]


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._by_id: dict[int, Response] = {}
        self._by_name: dict[str, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._free: list[int] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(self, req: TensorRequest, rank: int) -> int | None:
        """The id of a cached response this rank's request matches exactly, or None."""
        cid = self._by_name.get(req.name)
        if cid is None:
            return None
        resp = self._by_id[cid]
        if resp.request.common() != req.common():
            return None
        if resp.per_rank and resp.per_rank[rank] != req.rank_part():
            return None
        return cid

    def id_of(self, name: str) -> int | None:
        """The id of the cached response named ``name`` (None: not cached)."""
        return self._by_name.get(name)

    def get(self, cid: int) -> Response:
        return self._by_id[cid]

    def put(self, resp: Response) -> None:
        """Record an executed response (or refresh it); evicts the oldest at capacity."""
        if not resp.cacheable or self.capacity == 0:
            return
        old = self._by_name.get(resp.name)
        if old is not None:
            self._by_id[old] = resp
            self._lru.move_to_end(old)
            return
        if len(self._by_id) >= self.capacity:
            victim, _ = self._lru.popitem(last=False)
            del self._by_name[self._by_id.pop(victim).name]
            self._free.append(victim)
        if self._free:
            self._free.sort()
            cid = self._free.pop(0)
        else:
            cid = self._next
            self._next += 1
        self._by_id[cid] = resp
        self._by_name[resp.name] = cid
        self._lru[cid] = None

    def touch(self, resp: Response) -> None:
        cid = self._by_name.get(resp.name)
        if cid is not None:
            self._lru.move_to_end(cid)


def ids_to_bits(ids: set[int] | list[int]) -> bytes:
    if not ids:
        return b""
    out = bytearray(max(ids) // 8 + 1)
    for i in ids:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def bits_to_ids(bits: bytes) -> list[int]:
    return [i * 8 + b for i, byte in enumerate(bits) if byte for b in range(8) if byte >> b & 1]


def and_bits(vectors: list[bytes]) -> bytes:
    """Bitwise AND of every rank's vector (shorter vectors are zero-extended)."""
    if not vectors:
        return b""
    n = min(len(v) for v in vectors)
    out = bytearray(vectors[0][:n])
    for v in vectors[1:]:
        for i in range(n):
            out[i] &= v[i]
    return bytes(out)
