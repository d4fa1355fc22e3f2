"""Elastic data-parallel training of a small CNN on scikit-learn's digits.

    unison run -np 4 --min-np 2 --max-np 4 -H localhost:2,127.0.0.1:2 \\
        python examples/elastic_digits.py --lose-host-at 20

Written as for Horovod Elastic (``import horovod.torch as hvd`` would run it too):
``TorchState`` holds the model, the optimizer, the ``ElasticSampler`` and the epoch,
``@hvd.elastic.run`` wraps the training function, ``state.commit()`` runs every
``--batches-per-commit`` batches, and a reset callback rescales the learning rate to
the new number of workers. ``--lose-host-at STEP`` simulates losing the last host of
the first world at that step (its workers SIGKILL themselves): the survivors roll back
to the last commit, the launcher re-forms the world without that host, and training
goes on. The script prints how long that took (from the failure to the first
completed step after it), then checks the test accuracy and that every rank holds
identical parameters, and exits non-zero otherwise. With
``--host-discovery-script`` the job also grows when the script lists new slots.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from digits_data import Net, load_data
from torch.utils.data import DataLoader

import unison.torch as hvd
from unison import elastic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16, help="per worker")
    ap.add_argument("--lr", type=float, default=1e-3, help="per worker (scaled by size)")
    ap.add_argument("--batches-per-commit", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    ap.add_argument("--lose-host-at", type=int, default=0, metavar="STEP")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    run_module = importlib.import_module("unison.horovod.elastic")  # last_failure_at

    train, test = load_data(args.seed)
    sampler = hvd.elastic.ElasticSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, step=0)
    first_host = os.environ.get("HOROVOD_HOSTNAME", "")
    doomed = args.lose_host_at and hvd.cross_rank() == hvd.cross_size() - 1 > 0
    start = time.perf_counter()

    def on_reset() -> None:
        for group in opt.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} workers (round {elastic.current_round()})", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def fit(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            model.train()
            for i, (x, y) in enumerate(loader):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                sampler.record_batch(i, args.batch_size)
                state.step += 1
                if run_module.last_failure_at is not None and hvd.rank() == 0:
                    took = time.monotonic() - run_module.last_failure_at
                    print(f"recovered: first step {took:.2f} s after the failure", flush=True)
                run_module.last_failure_at = None
                if doomed and elastic.current_round() == 0 and state.step == args.lose_host_at:
                    print(f"losing host {first_host} at step {state.step}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if state.step % args.batches_per_commit == 0:
                    state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch:2d} done on {hvd.size()} workers", flush=True)

    fit(state)

    model.eval()
    with torch.no_grad():
        x, y = test.tensors
        acc = float((model(x).argmax(1) == y).float().mean())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    lo = hvd.allreduce(flat, op=hvd.Min, name="check.min")
    hi = hvd.allreduce(flat, op=hvd.Max, name="check.max")
    identical = bool(torch.equal(lo, hi))
    ok = acc >= args.min_accuracy and identical
    if hvd.rank() == 0:
        print(
            f"test accuracy {acc:.2%} on {len(test)} images, {hvd.size()} workers at the end "
            f"({time.perf_counter() - start:.1f}s)"
        )
        print(f"parameters identical on all {hvd.size()} ranks: {'yes' if identical else 'NO'}")
        print("OK" if ok else f"FAILED (need accuracy >= {args.min_accuracy:.0%})")
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
