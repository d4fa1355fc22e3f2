"""Small all-reduces carried inside the negotiation message: no data collective.

Every rank's cycle message reaches every other rank, so a small all-reduce can
ride along: each rank puts its (pre-scaled) bytes for a pending small tensor in
its message; when the tensor is agreed in that cycle and *every* rank's message
holds bytes for it, every rank reduces the same parts in rank order locally
(identical results everywhere, no further round trip). Whether a response runs
inline depends only on the messages, which every rank sees alike, so all ranks
choose the same way; any other response goes to the data collective as before.
"""

from __future__ import annotations

from typing import Any

import torch

from .execute import scale_, torch_dtype
from .handle import Entry
from .negotiation import HvdOp, RequestKind, Response

__all__ = ["INLINE_BUDGET", "deliver", "payload", "reduce_inline", "runs_inline"]

# bytes of tensor data one cycle message may carry (keeps it within one head frame)
INLINE_BUDGET = 512
_DTYPES = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float32,
    torch.float64,
}
_OPS = {int(HvdOp.SUM), int(HvdOp.AVERAGE), int(HvdOp.MIN), int(HvdOp.MAX), int(HvdOp.PRODUCT)}


def _eligible(e: Entry) -> bool:
    q = e.request
    if q.kind is not RequestKind.ALLREDUCE or q.op not in _OPS or not e.inputs:
        return False
    return all(t.dtype in _DTYPES for t in e.inputs)


def payload(entries: list[Entry]) -> dict[str, bytes]:
    """This rank's bytes for its pending small all-reduces (pre-scaled, flattened)."""
    out: dict[str, bytes] = {}
    left = INLINE_BUDGET
    for e in entries:
        if not _eligible(e):
            continue
        n = sum(t.numel() * t.element_size() for t in e.inputs)
        if n == 0 or n > left:
            continue
        flat = torch.cat([t.detach().reshape(-1) for t in e.inputs])  # a copy: safe to scale
        scale_(flat, e.request.prescale)
        out[e.request.name] = flat.numpy().tobytes()
        left -= n
    return out


def runs_inline(resp: Response, parts: list[dict[str, bytes]]) -> bool:
    """True when every rank's message carries this response's bytes (same on all ranks)."""
    q = resp.request
    if resp.error or q.kind is not RequestKind.ALLREDUCE or q.op not in _OPS:
        return False
    first = parts[0].get(resp.name)
    if first is None:
        return False
    return all(len(p.get(resp.name, b"")) == len(first) for p in parts[1:])


def reduce_inline(resp: Response, parts: list[dict[str, bytes]], size: int) -> torch.Tensor:
    """The reduced, post-scaled flat result of an inline response (rank order)."""
    q = resp.request
    dt = torch_dtype(q.dtype)
    vals = [torch.frombuffer(bytearray(p[resp.name]), dtype=dt) for p in parts]
    acc = vals[0]
    op = q.op
    for v in vals[1:]:
        if op in (HvdOp.SUM, HvdOp.AVERAGE):
            acc.add_(v)
        elif op == HvdOp.MIN:
            torch.minimum(acc, v, out=acc)
        elif op == HvdOp.MAX:
            torch.maximum(acc, v, out=acc)
        else:
            acc.mul_(v)
    post = q.postscale / size if op == HvdOp.AVERAGE else q.postscale
    scale_(acc, post)
    return acc


def deliver(e: Entry, flat: torch.Tensor) -> Any:
    """Copy ``flat`` into the entry's outputs; the value the executor would produce."""
    assert e.outputs is not None
    off = 0
    for t in e.outputs:
        n = t.numel()
        t.view(-1).copy_(flat[off : off + n])
        off += n
    return list(e.outputs)
