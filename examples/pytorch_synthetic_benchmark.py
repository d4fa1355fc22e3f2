"""Synthetic data-parallel throughput, in the style of Horovod's benchmark.

    unison run -np 2 python examples/pytorch_synthetic_benchmark.py --mode both

A convolutional model of about 10 M parameters (built inline, no download) is
trained on random batches. ``--mode unison`` uses ``unison.torch`` (Horovod's
API), ``--mode ddp`` the same model under ``torch.nn.parallel.DistributedDataParallel``
over a torch.distributed backend (``--ddp-backend gloo``, ``unison`` -- unison's
c10d backend, ``import unison.torch.distributed`` -- or ``both``), ``--mode both``
runs them one after the other in the same job and prints the step-time ratios
(DDP-unison / DDP-gloo is the one a DDP user sees when changing the backend name).
``--latency`` adds the per-operation overhead of a 4-byte allreduce through the stacks.
``--comm-bound`` is the communication-bound configuration (batch 1 per rank: a few
milliseconds of compute against 37 MB of gradients per step), the one the DDP
step-time ratio is quoted for:

    for n in 2 4; do unison run -np $n python examples/pytorch_synthetic_benchmark.py \
        --mode both --ddp-backend both --comm-bound; done

    unison run -np 2 python examples/pytorch_synthetic_benchmark.py --mode ddp --ddp-backend both
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
import timeit

import torch
import torch.nn as nn
import torch.nn.functional as F

import unison.torch as hvd


class Net(nn.Module):
    """About 10 M parameters, most of them in the first fully connected layer."""

    def __init__(self, width: int = 64, hidden: int = 512) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width // 2, 3, padding=1)
        self.conv2 = nn.Conv2d(width // 2, width, 3, padding=1)
        self.fc1 = nn.Linear(width * 16 * 16, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


GROUPS: dict[str, object] = {}  # torch.distributed backend name -> its process group


def run(args: argparse.Namespace, mode: str) -> float:
    """Mean seconds per step (``--num-batches-per-iter`` batches) for one mode
    (``unison``, or ``ddp-<backend>``)."""
    torch.manual_seed(0)
    model = Net()
    ddp = mode.startswith("ddp")
    lr = 0.01 * (1 if ddp else args.batches_per_allreduce)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 1000, (args.batch_size,))
    if ddp:
        import torch.distributed as dist

        group = GROUPS[mode.split("-", 1)[1]]
        model = nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=lr)

        def sync() -> None:
            dist.barrier(group=group)

    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        opt = hvd.DistributedOptimizer(
            opt,
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=args.batches_per_allreduce,
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        sync = hvd.barrier

    def step() -> None:
        for _ in range(args.num_batches_per_iter):
            opt.zero_grad()
            for _ in range(1 if ddp else args.batches_per_allreduce):
                F.cross_entropy(model(data), target).backward()
            opt.step()

    n_params = sum(p.numel() for p in model.parameters())
    log(f"[{mode}] model: {n_params / 1e6:.1f} M parameters, batch {args.batch_size} per rank")
    timeit.timeit(step, number=args.num_warmup_batches)
    sync()
    times = []
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=1)
        times.append(t)
        imgs = (
            args.batch_size * args.num_batches_per_iter * (1 if ddp else args.batches_per_allreduce)
        )
        log(f"[{mode}] iter #{i}: {imgs / t:.1f} img/sec per rank")
    sync()
    per_step = statistics.mean(times) / args.num_batches_per_iter
    imgs = args.batch_size * (1 if ddp else args.batches_per_allreduce)
    rate = imgs / per_step
    log(
        f"[{mode}] img/sec per rank: {rate:.1f}; total on {hvd.size()} ranks: "
        f"{rate * hvd.size():.1f}; step time {per_step * 1e3:.1f} ms"
    )
    return per_step


def latency(n: int) -> dict[str, float]:
    import torch.distributed as dist

    x = torch.zeros(1)
    out = {}
    for _ in range(50):
        hvd.allreduce(x, name="lat")
    hvd.barrier()
    t = time.perf_counter()
    for _ in range(n):
        hvd.allreduce(x, name="lat")
    out["unison.torch"] = (time.perf_counter() - t) / n * 1e6
    if dist.is_initialized():
        for _ in range(50):
            dist.all_reduce(x)
        dist.barrier()
        t = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x)
        out["torch.distributed gloo"] = (time.perf_counter() - t) / n * 1e6
    return out


def init_gloo(backends: list[str]) -> None:
    """The default group on Gloo (as before), plus a group per other ``backends``."""
    import torch.distributed as dist

    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0, name="gloo.port")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )
    GROUPS["gloo"] = dist.group.WORLD
    if "unison" in backends:
        import unison.torch.distributed  # noqa: F401  registers the c10d backend "unison"

        GROUPS["unison"] = dist.new_group(backend="unison")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["unison", "ddp", "both"], default="unison")
    ap.add_argument(
        "--ddp-backend",
        choices=["gloo", "unison", "both"],
        default="gloo",
        help="torch.distributed backend(s) under DDP",
    )
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument(
        "--comm-bound",
        action="store_true",
        help="communication-bound configuration: batch 1 per rank (overrides --batch-size)",
    )
    ap.add_argument("--num-warmup-batches", type=int, default=2)
    ap.add_argument("--num-batches-per-iter", type=int, default=5)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--batches-per-allreduce", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument(
        "--latency", type=int, default=0, metavar="N", help="also time N 4-byte allreduces"
    )
    args = ap.parse_args()
    if args.comm_bound:
        args.batch_size = 1

    hvd.init()
    torch.set_num_threads(args.threads)
    backends = ["gloo", "unison"] if args.ddp_backend == "both" else [args.ddp_backend]
    if args.mode in ("ddp", "both") or args.latency:
        init_gloo(backends)
    modes = [f"ddp-{b}" for b in backends]
    if args.mode != "ddp":
        modes = ["unison", *modes] if args.mode == "both" else ["unison"]
    results = {mode: run(args, mode) for mode in modes}
    config = "communication-bound, " if args.comm_bound else ""
    for mode in results:
        if mode != "ddp-gloo" and "ddp-gloo" in results:
            ratio = results[mode] / results["ddp-gloo"]
            log(
                f"step time {mode} / ddp-gloo: {ratio:.2f}x "
                f"(np={hvd.size()}, {config}batch {args.batch_size} per rank)"
            )
    if args.latency:
        for name, us in latency(args.latency).items():
            log(f"4-byte allreduce, {name}: {us:.0f} us per operation")
    hvd.shutdown()


if __name__ == "__main__":
    main()
