"""DDP, FSDP2 and distributed checkpoints over a backend: the same training, several ways."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import unison.torch.distributed  # noqa: F401  (registers "unison")

from ._jobs import init


class Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 3)
        if unused:  # no gradient: find_unused_parameters matters
            self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(77 + rank)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)) for _ in range(steps)]


def _train(rank: int, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    torch.manual_seed(5)
    model = Net(unused=bool(cfg.get("find_unused_parameters")))
    kw = {
        k: cfg[k]
        for k in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph")
        if k in cfg
    }
    ddp = DDP(model, bucket_cap_mb=0.0005, **kw)
    hook = cfg.get("hook")
    if hook == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    # uneven inputs: rank r has 4 + r batches; join() shadows the missing collectives
    steps = 4 + rank if cfg.get("join") else 4
    data = _batches(rank, steps)
    with ddp.join(enable=bool(cfg.get("join"))):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            if cfg.get("no_sync") and i % 2 == 0:
                with ddp.no_sync():
                    nn.functional.mse_loss(ddp(x), y).backward()
                continue  # gradients accumulate locally; the next step syncs them
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "unused": {"find_unused_parameters": True},
    "bucket_view": {"gradient_as_bucket_view": True},
    "static": {"static_graph": True},
    "no_sync": {"no_sync": True},
    "hook_allreduce": {"hook": "allreduce"},
    "hook_fp16": {"hook": "fp16"},
    "join": {"join": True},
    # DDP's join hook all-reduces the joined rank's used-parameter map through
    # ``process_group.allreduce(tensor)``, the C++ group's single-tensor form
    "join_unused": {"join": True, "find_unused_parameters": True},
}


def _pg_forms(rank: int) -> dict[str, np.ndarray]:
    """The Python forms of torch's ProcessGroup methods, called on the group itself:
    allreduce (tensor), (tensor, op), ([tensors], op), ([tensors], opts); reduce
    (tensor, root, op); broadcast (tensor, root)."""
    pg = dist.distributed_c10d._get_default_group()
    base = torch.tensor([3.0, -1.0, 7.0, 2.0]) * (rank + 1) + rank
    out = {}
    t = base.clone()
    pg.allreduce(t).wait()
    out["tensor"] = t
    t = base.clone()
    pg.allreduce(t, dist.ReduceOp.MAX).wait()
    out["tensor_op"] = t
    ts = [base.clone()]
    pg.allreduce(ts, dist.ReduceOp.MIN).wait()
    out["list_op"] = ts[0]
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.PRODUCT
    ts = [base.to(torch.int64)]
    pg.allreduce(ts, opts).wait()
    out["list_opts"] = ts[0]
    t = base.clone()  # reduce(tensor, root, op) to rank 0, then broadcast(tensor, root) from it
    pg.reduce(t, 0, dist.ReduceOp.MAX).wait()
    pg.broadcast(t, 0).wait()
    out["reduce_broadcast"] = t
    t = base.clone()
    pg.broadcast(t, 1).wait()
    out["broadcast_root1"] = t
    return {k: v.numpy().copy() for k, v in out.items()}


def ddp_job(backend: str) -> dict[str, dict[str, np.ndarray]]:
    rank, _size = init(backend)
    out = {name: _train(rank, cfg) for name, cfg in CONFIGS.items()}
    out["pg_forms"] = _pg_forms(rank)
    dist.barrier()
    dist.destroy_process_group()
    return out


def fsdp_dcp_job(backend: str, ckpt_dir: str) -> dict[str, Any]:
    """FSDP2 on CPU, then torch.distributed.checkpoint of its sharded state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    rank, _size = init(backend)
    res: dict[str, Any] = {}
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4))
    try:
        fully_shard(model[0])
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x = torch.randn(5, 8, generator=g)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        full = {k: v.full_tensor().detach().numpy().copy() for k, v in model.state_dict().items()}
        res["fsdp"] = full
        state = {"model": model.state_dict()}
        dcp.save(state, checkpoint_id=os.path.join(ckpt_dir, backend))
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(ckpt_dir, backend))
        model.load_state_dict(state["model"])
        back = {k: v.full_tensor().detach().numpy().copy() for k, v in model.state_dict().items()}
        res["dcp_roundtrip"] = all(np.array_equal(full[k], back[k]) for k in full)
    except Exception as exc:  # the exact error, compared with gloo's by the test
        res["fsdp_error"] = f"{type(exc).__name__}: {exc}"
        res["tb"] = __import__("traceback").format_exc()
    dist.barrier()
    dist.destroy_process_group()
    return res
