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

import numpy as np
import torch

from .handle import Entry
from .negotiation import HvdOp, RequestKind, Response

__all__ = ["INLINE_BUDGET", "deliver", "payload", "reduce_inline", "runs_inline"]

# bytes of tensor data one cycle message may carry (keeps it within one head frame)
INLINE_BUDGET = 512
# the dtypes that may ride along, by torch dtype and by the request's dtype label; the
# bytes are reduced with numpy (a few numpy calls cost less than the torch ops they
# replace, with the same results: same element type, same order, same scaling rule)
_NUMPY = {
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float32: np.float32,
    torch.float64: np.float64,
}
_BY_LABEL = {str(k): np.dtype(v) for k, v in _NUMPY.items()}
_OPS = {int(HvdOp.SUM), int(HvdOp.AVERAGE), int(HvdOp.MIN), int(HvdOp.MAX), int(HvdOp.PRODUCT)}


def _eligible(e: Entry) -> bool:
    q = e.request
    if q.kind is not RequestKind.ALLREDUCE or q.op not in _OPS or not e.inputs:
        return False
    return all(t.dtype in _NUMPY for t in e.inputs)


def _scaled(a: np.ndarray, factor: float) -> np.ndarray:
    """``a`` times ``factor`` as :func:`unison.torch.execute.scale_` computes it (floats in
    their own precision; integers in double precision, truncated)."""
    if factor == 1.0 or a.size == 0:
        return a
    if a.dtype.kind == "f":
        return a * factor
    return np.trunc(a.astype(np.float64) * factor).astype(a.dtype)


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
        parts = [t.detach().numpy().reshape(-1) for t in e.inputs]
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out[e.request.name] = _scaled(flat, e.request.prescale).tobytes()
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


def reduce_inline(resp: Response, parts: list[dict[str, bytes]], size: int) -> np.ndarray:
    """The reduced, post-scaled flat result of an inline response (rank order)."""
    q = resp.request
    dt = _BY_LABEL[q.dtype]
    acc = np.frombuffer(parts[0][resp.name], dt).copy()
    op = q.op
    for p in parts[1:]:
        v = np.frombuffer(p[resp.name], dt)
        if op in (HvdOp.SUM, HvdOp.AVERAGE):
            np.add(acc, v, out=acc)
        elif op == HvdOp.MIN:
            np.minimum(acc, v, out=acc)
        elif op == HvdOp.MAX:
            np.maximum(acc, v, out=acc)
        else:
            np.multiply(acc, v, out=acc)
    post = q.postscale / size if op == HvdOp.AVERAGE else q.postscale
    return _scaled(acc, post)


def deliver(e: Entry, flat: np.ndarray) -> Any:
    """Copy ``flat`` into the entry's outputs; the value the executor would produce."""
    assert e.outputs is not None
    src = torch.from_numpy(flat)
    if len(e.outputs) == 1:
        out = e.outputs[0]
        out.view(-1).copy_(src)
        return [out]
    off = 0
    for t in e.outputs:
        n = t.numel()
        t.view(-1).copy_(src[off : off + n])
        off += n
    return list(e.outputs)
