"""examples/pytorch_digits.py on Ray: the same CNN, data and bar, through RayExecutor.

    python examples/ray_digits.py --num-workers 2              # a local Ray instance
    python examples/ray_digits.py --address auto --num-workers 8   # a running cluster

``train`` is an unchanged Horovod training function (``import unison.torch as hvd``;
with ``horovod.torch`` and ``horovod.ray.RayExecutor`` it runs the same): each worker
actor runs it as one rank; the driver gets every rank's result in rank order and checks
the test accuracy and that all ranks ended with identical parameters.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def train(
    epochs: int = 12, batch_size: int = 64, lr: float = 2e-3, seed: int = 42
) -> dict[str, Any]:
    """One rank of the digits job; returns its view of the result."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import unison.torch as hvd

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.fc1 = nn.Linear(32 * 4 * 4, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.fc1(x.flatten(1)))
            return self.fc2(x)

    def total(value: float, name: str) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        return float(hvd.allreduce(t, name=name, op=hvd.Sum).item())

    hvd.init()
    torch.manual_seed(seed + hvd.rank())  # different on purpose: the broadcast fixes it
    rank, size = hvd.rank(), hvd.size()
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    train_set = TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr))
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size // size, sampler=sampler)

    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for epoch in range(1, epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()

    # test accuracy: each rank scores every size-th test image, the counts are summed
    model.eval()
    with torch.no_grad():
        xs, ys = torch.from_numpy(xte[rank::size]), torch.from_numpy(yte[rank::size])
        correct = int((model(xs).argmax(1) == ys).sum())
    accuracy = total(correct, "test.correct") / total(len(ys), "test.count")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    identical = bool(
        torch.equal(
            hvd.allreduce(flat, op=hvd.Min, name="check.min"),
            hvd.allreduce(flat, op=hvd.Max, name="check.max"),
        )
    )
    result = {"rank": rank, "size": size, "accuracy": accuracy, "identical": identical}
    hvd.shutdown()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--cpus-per-worker", type=float, default=1)
    ap.add_argument("--address", default=None, help="a Ray cluster (default: start one)")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    args = ap.parse_args()

    import ray

    from unison.ray import RayExecutor

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=max(2, int(args.num_workers * args.cpus_per_worker)))
    executor = RayExecutor(
        RayExecutor.create_settings(timeout_s=60),
        num_workers=args.num_workers,
        cpus_per_worker=args.cpus_per_worker,
    )
    executor.start()
    try:
        results = executor.run(train, kwargs={"epochs": args.epochs})
    finally:
        executor.shutdown()
    accuracy = results[0]["accuracy"]
    identical = all(r["identical"] for r in results)
    ok = accuracy >= args.min_accuracy and identical
    print(f"test accuracy {accuracy:.2%} ({args.num_workers} Ray workers)")
    print(f"parameters identical on all ranks: {'yes' if identical else 'NO'}")
    print("OK" if ok else f"FAILED (need accuracy >= {args.min_accuracy:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
