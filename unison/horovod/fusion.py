"""Tensor fusion planning: which consecutive responses travel as one message.

Pure logic. Consecutive all-reduces with the same dtype, op and scale factors
are packed, in execution order, into one buffer of at most ``threshold`` bytes
(a single tensor larger than the threshold travels alone). A tensor of at least
:data:`ALONE_BYTES` also travels alone: reduced in place it skips the copies into and
out of the fusion buffer (two passes over its bytes, milliseconds at that size),
which cost more than the one more collective it takes. Every rank plans the same
batches because it executes the same responses.
"""

from __future__ import annotations

from collections.abc import Sequence

from .negotiation import HvdOp, RequestKind, Response

__all__ = ["ALONE_BYTES", "fusion_key", "plan"]

#: tensors this large are never packed into a fusion buffer (see the module docstring)
ALONE_BYTES = 8 << 20


def fusion_key(resp: Response) -> tuple[object, ...] | None:
    """Responses with equal keys may share a fusion buffer; None: never fused."""
    q = resp.request
    if resp.error or q.kind is not RequestKind.ALLREDUCE or q.op == HvdOp.ADASUM:
        return None
    return (q.dtype, q.op, q.prescale, q.postscale, resp.joined)


def plan(responses: Sequence[Response], nbytes: Sequence[int], threshold: int) -> list[list[int]]:
    """Batches of indices into ``responses`` (every index exactly once, order kept)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_key: object = None
    cur_bytes = 0
    for i, resp in enumerate(responses):
        key = fusion_key(resp)
        if key is not None and nbytes[i] >= ALONE_BYTES:
            key = None  # alone, in place
        fits = cur and key is not None and key == cur_key and cur_bytes + nbytes[i] <= threshold
        if fits:
            cur.append(i)
            cur_bytes += nbytes[i]
            continue
        if cur:
            batches.append(cur)
        cur, cur_key, cur_bytes = [i], key, nbytes[i]
    if cur:
        batches.append(cur)
    return batches
