"""Small all-reduces carried in the negotiation message: no data collective.

Every rank's cycle message reaches every other rank, so a small all-reduce can
ride along: each rank puts its (pre-scaled) bytes for a pending small tensor in
its message; when the tensor is agreed in that cycle and *every* rank's message
holds bytes for it, every rank reduces the same parts in rank order locally
(identical results everywhere, no further round trip). Whether a response is
reduced from the carried bytes depends only on the messages, which every rank sees
alike, so all ranks choose the same way; any other response goes to the data
collective as before.
"""

from __future__ import annotations

import numpy as np

from ..buffers import DType
from .arrays import dtype_of, reduce_kernel, scale, scaled
from .handle import Entry
from .negotiation import HvdOp, RequestKind, Response

__all__ = ["CARRY_BUDGET", "CARRY_DTYPES", "CARRY_OPS", "carries", "deliver", "payload", "reduce"]

#: bytes of tensor data one cycle message may carry (keeps it within one head frame)
CARRY_BUDGET = 512
#: the element types that may ride along (their storage is their numpy type)
CARRY_DTYPES = frozenset(
    {DType.UINT8, DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.FLOAT32, DType.FLOAT64}
)
CARRY_OPS = frozenset(
    {int(HvdOp.SUM), int(HvdOp.AVERAGE), int(HvdOp.MIN), int(HvdOp.MAX), int(HvdOp.PRODUCT)}
)


def _eligible(e: Entry) -> bool:
    q = e.request
    if q.kind is not RequestKind.ALLREDUCE or q.op not in CARRY_OPS or not e.inputs:
        return False
    return e.inputs[0].dtype in CARRY_DTYPES


def payload(entries: list[Entry]) -> dict[str, bytes]:
    """This rank's bytes for its pending small all-reduces (pre-scaled, flattened)."""
    out: dict[str, bytes] = {}
    left = CARRY_BUDGET
    for e in entries:
        if not _eligible(e):
            continue
        n = sum(b.nbytes for b in e.inputs)
        if n == 0 or n > left:
            continue
        parts = [b.array for b in e.inputs]
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out[e.request.name] = scaled(flat, e.inputs[0].dtype, e.request.prescale).tobytes()
        left -= n
    return out


def carries(resp: Response, parts: list[dict[str, bytes]]) -> bool:
    """True when every rank's message carries this response's bytes (same on all ranks)."""
    q = resp.request
    if resp.error or q.kind is not RequestKind.ALLREDUCE or q.op not in CARRY_OPS:
        return False
    first = parts[0].get(resp.name)
    if first is None:
        return False
    return all(len(p.get(resp.name, b"")) == len(first) for p in parts[1:])


def reduce(resp: Response, parts: list[dict[str, bytes]], size: int) -> np.ndarray:
    """The reduced, post-scaled flat result of a carried response (rank order)."""
    q = resp.request
    dt = dtype_of(q.dtype)
    acc = np.frombuffer(parts[0][resp.name], dt.storage).copy()
    combine = reduce_kernel(q.op, dt)
    for p in parts[1:]:
        combine(acc, np.frombuffer(p[resp.name], dt.storage), acc)
    post = q.postscale / size if q.op == HvdOp.AVERAGE else q.postscale
    scale(acc, dt, post)
    return acc


def deliver(e: Entry, flat: np.ndarray) -> list[object]:
    """Copy ``flat`` into the entry's outputs; the value the execution would produce."""
    assert e.outputs is not None
    off = 0
    for b in e.outputs:
        n = b.count
        b.array[...] = flat[off : off + n]
        off += n
    return list(e.outputs)
