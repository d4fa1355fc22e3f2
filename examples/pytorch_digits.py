"""Data-parallel training of a small CNN on scikit-learn's handwritten digits.

    unison run -np 2 python examples/pytorch_digits.py

Written exactly as for Horovod (``import horovod.torch as hvd`` would run it
too): the data set is sharded with ``DistributedSampler``, gradients are
averaged by ``hvd.DistributedOptimizer``, and every rank starts from rank 0's
parameters and optimizer state. The global batch is fixed (``--batch-size``,
split over the ranks), so np=1 and np=2 train the same way and reach the same
accuracy. At the end the script checks the test accuracy and that every rank
holds identical parameters, and exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from digits_data import Net, load_data
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import unison.torch as hvd


def metric_sum(value: float, name: str) -> float:
    return float(
        hvd.allreduce(torch.tensor([value], dtype=torch.float64), name=name, op=hvd.Sum).item()
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: broadcast fixes it
    rank, size = hvd.rank(), hvd.size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {size} ranks")

    train, test = load_data(args.seed)
    sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size // size, sampler=sampler)

    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    # a progress bar only on a terminal (under `unison run` the launcher says whether its
    # output is one); in a file or a pipe the one line per epoch below is the progress
    on_tty = os.environ.get("UNISON_OUTPUT_TTY", "1" if sys.stderr.isatty() else "0") == "1"
    show = rank == 0 and not args.no_progress and on_tty
    if show:
        from tqdm import tqdm
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        batches = tqdm(loader, desc=f"epoch {epoch:2d}", leave=False, ncols=80) if show else loader
        loss_sum, correct, seen = 0.0, 0, 0
        for x, y in batches:
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        n = metric_sum(seen, "epoch.seen")
        tr_loss = metric_sum(loss_sum, "epoch.loss") / n
        tr_acc = metric_sum(correct, "epoch.correct") / n
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {tr_loss:.4f}  train accuracy {tr_acc:.2%}", flush=True)

    # Test accuracy: each rank scores a shard of the test set, the counts are summed.
    model.eval()
    test_sampler = DistributedSampler(test, num_replicas=size, rank=rank, shuffle=False)
    idx = list(test_sampler)[: (len(test) - rank + size - 1) // size]  # no padded repeats
    with torch.no_grad():
        x, y = test.tensors[0][idx], test.tensors[1][idx]
        correct = int((model(x).argmax(1) == y).sum())
    acc = metric_sum(correct, "test.correct") / metric_sum(len(idx), "test.count")

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    lo = hvd.allreduce(flat, op=hvd.Min, name="check.min")
    hi = hvd.allreduce(flat, op=hvd.Max, name="check.max")
    identical = bool(torch.equal(lo, hi))
    elapsed = time.perf_counter() - start
    ok = acc >= args.min_accuracy and identical
    if rank == 0:
        print(
            f"test accuracy {acc:.2%} on {len(test)} images ({size} ranks, "
            f"{elapsed:.1f}s of training)"
        )
        print(f"parameters identical on all {size} ranks: {'yes' if identical else 'NO'}")
        print("OK" if ok else f"FAILED (need accuracy >= {args.min_accuracy:.0%})")
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
