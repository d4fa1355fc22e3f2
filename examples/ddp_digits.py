"""The digits CNN of examples/pytorch_digits.py as a plain torch.distributed DDP script.

    unison run -np 2 python examples/ddp_digits.py             # backend "unison"
    unison run -np 2 python examples/ddp_digits.py --backend gloo
    torchrun --nproc-per-node 2 examples/ddp_digits.py

Nothing here is unison's API: the process group is torch.distributed's (``env://``:
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), the model is wrapped in
``DistributedDataParallel``, the data is sharded with ``DistributedSampler``. The
only unison lines are the import that registers the backend and its name. At the
end the script checks the test accuracy and that every rank holds identical
parameters, and exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from digits_data import Net, load_data
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import unison.torch.distributed  # noqa: F401  registers the backend "unison"


def total(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="unison")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {size} ranks")
    torch.manual_seed(args.seed + rank)  # different on purpose: DDP broadcasts rank 0's

    train, test = load_data(args.seed)
    sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size // size, sampler=sampler)

    model = DDP(Net())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        loss_sum, correct, seen = 0.0, 0, 0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        n = total(seen)
        tr_loss, tr_acc = total(loss_sum) / n, total(correct) / n
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {tr_loss:.4f}  train accuracy {tr_acc:.2%}", flush=True)

    # Test accuracy: each rank scores a shard of the test set, the counts are summed.
    model.eval()
    idx = list(range(rank, len(test), size))
    with torch.no_grad():
        x, y = test.tensors[0][idx], test.tensors[1][idx]
        correct = int((model.module(x).argmax(1) == y).sum())
    acc = total(correct) / total(len(idx))

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    identical = bool(torch.equal(lo, hi))
    elapsed = time.perf_counter() - start
    ok = acc >= args.min_accuracy and identical
    if rank == 0:
        print(
            f"test accuracy {acc:.2%} on {len(test)} images ({size} ranks, backend "
            f"{dist.get_backend()}, {elapsed:.1f}s of training)"
        )
        print(f"parameters identical on all {size} ranks: {'yes' if identical else 'NO'}")
        print("OK" if ok else f"FAILED (need accuracy >= {args.min_accuracy:.0%})")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
