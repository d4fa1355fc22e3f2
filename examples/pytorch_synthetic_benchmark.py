"""Synthetic data-parallel throughput, in the style of Horovod's benchmark.

    unison run -np 2 python examples/pytorch_synthetic_benchmark.py --mode both

A model (built inline, no download) is trained on random batches. ``--mode unison``
uses ``unison.torch`` (Horovod's API); ``--mode ddp`` the same model under
``torch.nn.parallel.DistributedDataParallel`` over a torch.distributed backend
(``--ddp-backend gloo``, ``unison`` -- unison's c10d backend, ``import
unison.torch.distributed`` -- or ``both``); ``--mode both`` runs the Horovod API,
then DDP, in the same job.

With ``--ddp-backend both`` the default group is ``"unison"`` (what a DDP user gets
from ``dist.init_process_group("unison")``) and Gloo runs on a second group of all
ranks (``new_group(backend="gloo")``, Gloo's full speed: every Gloo group has its
own connections). The two DDP models train *interleaved*: each iteration times
``--num-batches-per-iter`` steps of one backend, then of the other, so changing
load on the machine slows both alike; the ratio is taken from the medians. For
each backend it also times the same steps under ``no_sync()`` (DDP's computation
with no communication: forward, backward, optimizer) and an all_reduce of all the
gradients alone, and prints the communication share of the step,
``1 - compute / step``. ``--fsdp`` adds FSDP2 (``fully_shard`` per layer) steps of
the same model over each backend to the interleaved loop.

Models (``--model``): ``conv`` (default: about 9.2 M parameters, two convolutions
and three fully connected layers, 32x32 images, batch ``--batch-size``) and
``mlp`` (``--depth`` fully connected layers of ``--width`` units, batch
``--batch-size``). ``--comm-bound`` is the communication-bound configuration the
DDP ratio is quoted for: ``--model mlp --width 512 --depth 16 --batch-size 1``
(4.7 M parameters, 19 MB of gradients, about a millisecond of arithmetic per step,
so the step is the gradients' all-reduce: the communication share is printed).

    for n in 2 4; do unison run -np $n python examples/pytorch_synthetic_benchmark.py \\
        --mode ddp --ddp-backend both --comm-bound; done

    unison run -np 2 python examples/pytorch_synthetic_benchmark.py --mode ddp --ddp-backend both
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
import timeit
from collections.abc import Callable

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


def make_model(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model, one batch of inputs and its targets (the same on every call: seed 0)."""
    torch.manual_seed(0)
    model: nn.Module
    if args.model == "conv":
        model, data = Net(), torch.randn(args.batch_size, 3, 32, 32)
    else:
        layers: list[nn.Module] = []
        for _ in range(args.depth):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(args.width, 1000))
        data = torch.randn(args.batch_size, args.width)
    return model, data, torch.randint(0, 1000, (args.batch_size,))


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


GROUPS: dict[str, object] = {}  # torch.distributed backend name -> its process group


def run_unison(args: argparse.Namespace) -> float:
    """Mean seconds per step of the Horovod API (``unison.torch``)."""
    model, data, target = make_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * args.batches_per_allreduce)
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=args.batches_per_allreduce,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    def step() -> None:
        for _ in range(args.num_batches_per_iter):
            opt.zero_grad()
            for _ in range(args.batches_per_allreduce):
                F.cross_entropy(model(data), target).backward()
            opt.step()

    n_params = sum(p.numel() for p in model.parameters())
    log(f"[unison] model: {n_params / 1e6:.1f} M parameters, batch {args.batch_size} per rank")
    timeit.timeit(step, number=args.num_warmup_batches)
    hvd.barrier()
    times = []
    imgs = args.batch_size * args.num_batches_per_iter * args.batches_per_allreduce
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=1)
        times.append(t)
        log(f"[unison] iter #{i}: {imgs / t:.1f} img/sec per rank")
    hvd.barrier()
    per_step = statistics.mean(times) / args.num_batches_per_iter
    rate = args.batch_size * args.batches_per_allreduce / per_step
    log(
        f"[unison] img/sec per rank: {rate:.1f}; total on {hvd.size()} ranks: "
        f"{rate * hvd.size():.1f}; step time {per_step * 1e3:.1f} ms"
    )
    return per_step


def run_ddp(args: argparse.Namespace, backends: list[str]) -> dict[str, list[float]]:
    """Seconds per step, one sample per iteration, of each timed function, interleaved:
    ``ddp-<b>`` (a DDP step), ``compute-<b>`` (the same step under ``no_sync()``) and
    ``comm-<b>`` (an all_reduce of all the gradients alone) for each backend ``b``."""
    import torch.distributed as dist

    fns: dict[str, Callable[[], None]] = {}
    n_params = 0
    for b in backends:
        group = GROUPS[b]
        net, data, target = make_model(args)
        model = nn.parallel.DistributedDataParallel(
            net,
            process_group=group,
            bucket_cap_mb=args.bucket_cap_mb,
            gradient_as_bucket_view=args.gradient_as_bucket_view,
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        n_params = sum(p.numel() for p in model.parameters())
        flat = torch.zeros(n_params)

        def step(m: nn.Module = model, o: torch.optim.Optimizer = opt, x=data, y=target) -> None:
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()

        def compute(m=model, o: torch.optim.Optimizer = opt, x=data, y=target) -> None:
            o.zero_grad()
            with m.no_sync():
                F.cross_entropy(m(x), y).backward()
            o.step()

        def comm(t: torch.Tensor = flat, g: object = group) -> None:
            dist.all_reduce(t, group=g)

        fns[f"ddp-{b}"], fns[f"compute-{b}"], fns[f"comm-{b}"] = step, compute, comm
        if args.fsdp:
            fns[f"fsdp-{b}"] = fsdp_step(args, group)
    log(
        f"[ddp] model {args.model}: {n_params / 1e6:.1f} M parameters "
        f"({n_params * 4 / 1e6:.0f} MB of float32 gradients), batch {args.batch_size} per rank, "
        f"bucket_cap_mb={args.bucket_cap_mb}, "
        f"gradient_as_bucket_view={args.gradient_as_bucket_view}"
    )
    barrier = GROUPS[backends[0]]
    for fn in fns.values():
        for _ in range(args.num_warmup_batches):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(args.num_iters):
        for name, fn in fns.items():
            dist.barrier(group=barrier)
            t = time.perf_counter()
            for _ in range(args.num_batches_per_iter):
                fn()
            samples[name].append((time.perf_counter() - t) / args.num_batches_per_iter)
        log(
            f"[ddp] iter #{i}: "
            + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in samples.items() if "ddp" in k)
        )
    return samples


def fsdp_step(args: argparse.Namespace, group: object) -> Callable[[], None]:
    """One FSDP2 step (``fully_shard`` on every layer with parameters, then the root) of
    the same model over ``group``: all-gathers in forward/backward, reduce-scatters."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model, data, target = make_model(args)
    mesh = DeviceMesh.from_group(group, device_type="cpu")
    for layer in model.modules():
        if layer is not model and isinstance(layer, (nn.Linear, nn.Conv2d)):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    return step


def report_ddp(args: argparse.Namespace, samples: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in samples.items()}
    config = "communication-bound config, " if args.comm_bound else ""
    where = f"np={hvd.size()}, {config}model {args.model}, batch {args.batch_size} per rank"
    for b in [k[4:] for k in med if k.startswith("ddp-")]:
        step, compute, comm = med[f"ddp-{b}"], med[f"compute-{b}"], med[f"comm-{b}"]
        log(
            f"[ddp-{b}] step {step * 1e3:.1f} ms (min {min(samples[f'ddp-{b}']) * 1e3:.1f}), "
            f"compute alone (no_sync) {compute * 1e3:.1f} ms, all_reduce of all gradients "
            f"alone {comm * 1e3:.1f} ms; communication share of the step "
            f"{max(0.0, 1 - compute / step) * 100:.0f}%; "
            f"img/sec per rank {args.batch_size / step:.1f}"
        )
    if "fsdp-gloo" in med and "fsdp-unison" in med:
        log(
            f"FSDP2 step: unison {med['fsdp-unison'] * 1e3:.1f} ms, gloo "
            f"{med['fsdp-gloo'] * 1e3:.1f} ms; fsdp-unison / fsdp-gloo: "
            f"{med['fsdp-unison'] / med['fsdp-gloo']:.2f}x ({where})"
        )
    if "ddp-gloo" in med and "ddp-unison" in med:
        log(
            f"step time ddp-unison / ddp-gloo: {med['ddp-unison'] / med['ddp-gloo']:.2f}x "
            f"(median of interleaved iterations; {where}); all_reduce alone: "
            f"{med['comm-unison'] / med['comm-gloo']:.2f}x"
        )


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
        for name, group in GROUPS.items():
            for _ in range(50):
                dist.all_reduce(x, group=group)
            dist.barrier(group=group)
            t = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(x, group=group)
            out[f"torch.distributed {name}"] = (time.perf_counter() - t) / n * 1e6
    return out


def init_dist(backends: list[str]) -> None:
    """The default group on unison when it is measured (what a DDP user's one-line change
    gives), else on Gloo; Gloo on a group of all ranks of its own next to it."""
    import torch.distributed as dist

    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0, name="dist.port")
    default = "unison" if "unison" in backends else "gloo"
    if default == "unison":
        import unison.torch.distributed  # noqa: F401  registers the c10d backend "unison"
    dist.init_process_group(
        default, init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )
    GROUPS[default] = dist.group.WORLD
    if default == "unison" and "gloo" in backends:
        GROUPS["gloo"] = dist.new_group(backend="gloo")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["unison", "ddp", "both"], default="unison")
    ap.add_argument(
        "--ddp-backend",
        choices=["gloo", "unison", "both"],
        default="gloo",
        help="torch.distributed backend(s) under DDP",
    )
    ap.add_argument("--model", choices=["conv", "mlp"], default="conv")
    ap.add_argument("--width", type=int, default=512, help="mlp: units per layer")
    ap.add_argument("--depth", type=int, default=16, help="mlp: hidden layers")
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    ap.add_argument("--gradient-as-bucket-view", action="store_true")
    ap.add_argument(
        "--fsdp", action="store_true", help="also time FSDP2 (fully_shard) steps of the model"
    )
    ap.add_argument(
        "--comm-bound",
        action="store_true",
        help="the communication-bound configuration: --model mlp --width 512 --depth 16 "
        "--batch-size 1",
    )
    ap.add_argument("--num-warmup-batches", type=int, default=2)
    ap.add_argument("--num-batches-per-iter", type=int, default=5)
    ap.add_argument("--num-iters", type=int, default=10)
    ap.add_argument("--batches-per-allreduce", type=int, default=1)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads per rank (default: the launcher's OMP_NUM_THREADS)",
    )
    ap.add_argument(
        "--latency", type=int, default=0, metavar="N", help="also time N 4-byte allreduces"
    )
    args = ap.parse_args()
    if args.comm_bound:
        args.model, args.width, args.depth, args.batch_size = "mlp", 512, 16, 1

    hvd.init()
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = ["gloo", "unison"] if args.ddp_backend == "both" else [args.ddp_backend]
    if args.mode in ("ddp", "both") or args.latency:
        init_dist(backends)
    if args.mode != "ddp":
        run_unison(args)
    if args.mode != "unison":
        report_ddp(args, run_ddp(args, backends))
    if args.latency:
        for name, us in latency(args.latency).items():
            log(f"4-byte allreduce, {name}: {us:.0f} us per operation")
    hvd.shutdown()


if __name__ == "__main__":
    main()
