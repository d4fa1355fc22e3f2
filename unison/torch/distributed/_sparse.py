"""``all_reduce`` of a sparse COO tensor (Gloo's sparse all_reduce: SUM only).

Every rank's non-zero entries are gathered (their counts first, then the indices and
values padded to the largest count) and summed into a coalesced sparse tensor, which
replaces the contents of the caller's tensor, as torch's Gloo backend does.
"""

from __future__ import annotations

import torch

from ..._types import ReduceOp
from ...comm import collectives as _c
from ...comm.group import Group
from ...errors import UnsupportedError

__all__ = ["all_reduce_sparse", "is_sparse"]


def is_sparse(t: torch.Tensor) -> bool:
    return t.layout is torch.sparse_coo


def all_reduce_sparse(comm: Group, t: torch.Tensor, op: ReduceOp) -> None:
    """Sum the sparse COO tensor ``t`` over ``comm`` in place (blocking)."""
    if op is not ReduceOp.SUM:
        raise UnsupportedError(
            f"all_reduce on rank {comm.global_rank}: a sparse tensor can only be summed "
            f"(ReduceOp.SUM), got {op.name}"
        )
    if t.device.type != "cpu":
        raise UnsupportedError(
            f"all_reduce on rank {comm.global_rank}: sparse tensors must be on the CPU, "
            f"got {t.device}"
        )
    mine = t.detach().coalesce()
    idx = mine.indices().contiguous()
    val = mine.values().contiguous()
    n = comm.size
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    _c.all_gather(comm, counts, torch.tensor([idx.shape[1]], dtype=torch.int64), False)
    nnz = [int(c.item()) for c in counts]
    top = max(nnz)
    if top == 0:  # nothing anywhere: the sum is empty too
        t.copy_(torch.sparse_coo_tensor(idx, val, t.shape, dtype=t.dtype))
        return
    pad_idx = torch.zeros((idx.shape[0], top), dtype=idx.dtype)
    pad_idx[:, : idx.shape[1]] = idx
    pad_val = torch.zeros((top, *val.shape[1:]), dtype=val.dtype)
    pad_val[: val.shape[0]] = val
    all_idx = [torch.empty_like(pad_idx) for _ in range(n)]
    all_val = [torch.empty_like(pad_val) for _ in range(n)]
    _c.all_gather(comm, all_idx, pad_idx, False)
    _c.all_gather(comm, all_val, pad_val, False)
    indices = torch.cat([a[:, :k] for a, k in zip(all_idx, nnz, strict=True)], dim=1)
    values = torch.cat([a[:k] for a, k in zip(all_val, nnz, strict=True)], dim=0)
    total = torch.sparse_coo_tensor(indices, values, t.shape, dtype=t.dtype).coalesce()
    t.copy_(total)
