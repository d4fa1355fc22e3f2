"""Training step A/B in one job (issue 11, round 5): the Horovod API (DistributedOptimizer),
DDP over Gloo, DDP over unison's c10d backend, DDP's own work ("ddp-local": a comm hook
that divides each bucket and communicates nothing, so its step is the compute plus DDP's
copies into and out of its buckets) and compute alone (DDP under no_sync), each a model
of its own, interleaved step by step, on the benchmark's models. Per variant: wall
min / median (ms), process CPU median (ms, getrusage, all threads), context switches
median, and the ratios of the medians against DDP over Gloo. ``MODEL=conv`` is the
default convnet (batch 32); ``MODEL=comm`` (the default here) the communication-bound MLP
of ``--comm-bound`` (``LAYERS`` hidden Linear(512, 512) layers, default 16, and a
1000-way output; batch 1; 19 MB of gradients at 16). Each rank trains on its own batch;
at the end the largest parameter difference of each variant against DDP over Gloo (same
start, same steps) is reported, and whether DDP over Gloo's parameters agree on every
rank. Optional Horovod variants, interleaved with the
rest: ``ALONE=<bytes>`` adds "hvd-alone" (tensors of at least that many bytes are reduced
in place, never fused: unison.horovod.fusion.ALONE_BYTES), ``CYCLE=<ms>`` adds "hvd-cycle"
(Horovod's cycle time: the engine waits that long to gather more tensors per cycle).

    unison run -np 2 python benchmarks/hvd_train_ab.py [iters]     # 20
    MODEL=conv unison run -np 2 python benchmarks/hvd_train_ab.py
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import unison.torch as hvd
import unison.torch.distributed  # noqa: F401  (the c10d backend "unison")
from unison.torch.basics import engine_of

sys.path.insert(0, "examples")
from pytorch_synthetic_benchmark import Net

MODEL = os.environ.get("MODEL", "comm")
LAYERS = int(os.environ.get("LAYERS", "16"))  # hidden Linear(512, 512) layers of "comm"


def make() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The same initial model on every rank and each rank's own batch."""
    torch.manual_seed(0)
    if MODEL == "conv":
        m: nn.Module = Net()
        shape, n = (32, 3, 32, 32), 32
    else:
        layers: list[nn.Module] = []
        for _ in range(LAYERS):
            layers += [nn.Linear(512, 512), nn.ReLU()]
        m = nn.Sequential(*layers, nn.Linear(512, 1000))
        shape, n = (1, 512), 1
    g = torch.Generator().manual_seed(1 + hvd.rank())
    return m, torch.randn(*shape, generator=g), torch.randint(0, 1000, (n,), generator=g)


def _local_hook(size, bucket):  # type: ignore[no-untyped-def]  # DDP refuses string annotations
    """DDP's comm hook for "ddp-local": the bucket divided by the world size, as DDP's own
    all-reduce path divides it, and no communication."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer().div_(size))
    return fut


def main() -> None:
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    steps = int(os.environ.get("STEPS", "5"))  # steps per timed sample
    hvd.init()
    torch.set_num_threads(1)
    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0, name="port")
    dist.init_process_group(
        "unison", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )
    gloo = dist.new_group(backend="gloo")
    eng = engine_of(hvd.global_process_set)
    m1, data, target = make()
    o1 = hvd.DistributedOptimizer(
        torch.optim.SGD(m1.parameters(), lr=0.01), named_parameters=m1.named_parameters()
    )

    def hstep() -> None:
        for _ in range(steps):
            o1.zero_grad()
            F.cross_entropy(m1(data), target).backward()
            o1.step()

    fns = {"hvd": hstep}
    if os.environ.get("ALONE"):  # tensors of at least ALONE bytes never fused
        from unison.horovod import fusion

        alone0, alone1 = fusion.ALONE_BYTES, int(os.environ["ALONE"])

        def hstep_alone() -> None:
            fusion.ALONE_BYTES = alone1
            try:
                hstep()
            finally:
                fusion.ALONE_BYTES = alone0

        fns["hvd-alone"] = hstep_alone
    if os.environ.get("CYCLE"):  # Horovod's cycle time (ms) for this variant
        import dataclasses

        s0 = eng.settings
        s1 = dataclasses.replace(s0, cycle_time=float(os.environ["CYCLE"]) / 1000)

        def hstep_cycle() -> None:
            eng.settings = s1
            try:
                hstep()
            finally:
                eng.settings = s0

        fns["hvd-cycle"] = hstep_cycle
    models = {"hvd": m1}
    variants = (("ddp-gloo", gloo), ("ddp-unison", None), ("ddp-local", None), ("compute", gloo))
    for name, group in variants:
        m = nn.parallel.DistributedDataParallel(make()[0], process_group=group)
        if name == "ddp-local":  # DDP's own work per step, without communicating
            m.register_comm_hook(hvd.size(), _local_hook)
        o = torch.optim.SGD(m.parameters(), lr=0.01)

        def dstep(m: nn.Module = m, o: torch.optim.Optimizer = o) -> None:
            for _ in range(steps):
                o.zero_grad()
                F.cross_entropy(m(data), target).backward()
                o.step()

        def nstep(m: nn.Module = m, o: torch.optim.Optimizer = o) -> None:
            for _ in range(steps):
                o.zero_grad()
                with m.no_sync():  # type: ignore[operator]
                    F.cross_entropy(m(data), target).backward()
                o.step()

        fns[name] = nstep if name == "compute" else dstep
        if name not in ("compute", "ddp-local"):
            models[name] = m.module
    for f in fns.values():
        for _ in range(2):
            f()
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
    for i in range(iters):
        order = list(fns.items())
        if i % 2:
            order.reverse()
        for k, f in order:
            dist.barrier(group=gloo)
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            f()
            t1 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            cs = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw
            res[k].append(((t1 - t0) / steps, cpu / steps, cs / steps))
    out: dict[str, object] = {"model": MODEL, "np": hvd.size(), "load": os.getloadavg()[0]}
    med = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
    for k, v in res.items():
        out[k] = {
            "min_ms": round(min(x[0] for x in v) * 1e3, 1),
            "med_ms": round(med[k] * 1e3, 1),
            "cpu_ms": round(statistics.median(x[1] for x in v) * 1e3, 1),
            "cs": round(statistics.median(x[2] for x in v)),
            "vs_ddp_gloo": round(med[k] / med["ddp-gloo"], 2),
        }
    # every variant that averaged the gradients ran the same steps from the same start
    ref = torch.cat([p.detach().flatten() for p in models["ddp-gloo"].parameters()])
    for k, mod in models.items():
        if (
            k in fns
            and k != "ddp-gloo"
            and not os.environ.get("ALONE")
            and not os.environ.get("CYCLE")
        ):
            mine = torch.cat([p.detach().flatten() for p in mod.parameters()])
            out[f"{k}_max_param_diff"] = float((mine - ref).abs().max())
    ref_all = hvd.allgather_object(ref.numpy().tobytes(), name="params")
    out["ddp_gloo_params_equal_on_every_rank"] = len(set(ref_all)) == 1
    if hvd.rank() == 0:
        print("RESULT", json.dumps(out), flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
