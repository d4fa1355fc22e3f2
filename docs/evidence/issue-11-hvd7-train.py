"""Training step profile, np=2: Horovod API (DistributedOptimizer) vs DDP over Gloo,
interleaved in one job (issue 11, hvd7). Per step: wall, process CPU (getrusage),
context switches, and inside the executor the time of each fused all-reduce split into
pack / all_reduce / unpack, with its size and when it started relative to step().

    unison run -np 2 .venv/bin/python docs/evidence/issue-11-hvd7-train.py [iters]
"""

from __future__ import annotations

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
from unison.torch import execute as ex

sys.path.insert(0, "examples")
from pytorch_synthetic_benchmark import Net

EVENTS: list[tuple[str, float, float, int]] = []
_orig = ex.Executor._allreduce


def _traced(self, resps, ents):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = _orig(self, resps, ents)
    n = sum(e.inputs[0].numel() for e in ents if e is not None)
    EVENTS.append(("ar", t, time.perf_counter(), n * len(resps) and n))
    return out


ex.Executor._allreduce = _traced  # type: ignore[method-assign]

_allred = ex.all_reduce


def _traced_ar(buf, op, group):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    _allred(buf, op, group)
    EVENTS.append(("wire", t, time.perf_counter(), buf.numel()))


ex.all_reduce = _traced_ar

if os.environ.get("FUSE_ALL"):  # the old plan: big tensors packed too
    from unison.torch import fusion

    fusion.ALONE_BYTES = 1 << 62

PROF = None
if os.environ.get("PROF"):  # cProfile of the engine thread (times inflated; read the split)
    import cProfile

    from unison.torch import engine as _eng

    PROF = cProfile.Profile()
    _loop = _eng.TorchEngine._loop

    def _prof_loop(self):  # type: ignore[no-untyped-def]
        PROF.enable()
        try:
            _loop(self)
        finally:
            PROF.disable()

    _eng.TorchEngine._loop = _prof_loop  # type: ignore[method-assign]


def threads() -> dict[str, float]:
    """CPU seconds per thread name (utime + stime ticks of /proc/self/task)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    hz = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = names.get(int(tid)) or raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / hz
    return out


def main() -> None:
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    hvd.init()
    torch.set_num_threads(1)
    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0, name="port")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )
    torch.manual_seed(0)
    data, target = torch.randn(32, 3, 32, 32), torch.randint(0, 1000, (32,))
    m1 = Net()
    o1 = hvd.DistributedOptimizer(
        torch.optim.SGD(m1.parameters(), lr=0.01), named_parameters=m1.named_parameters()
    )
    torch.manual_seed(0)
    m2 = nn.parallel.DistributedDataParallel(Net())
    o2 = torch.optim.SGD(m2.parameters(), lr=0.01)
    marks: dict[str, float] = {}

    def hstep() -> None:
        o1.zero_grad()
        F.cross_entropy(m1(data), target).backward()
        marks["bw_end"] = time.perf_counter()
        o1.step()

    def dstep() -> None:
        o2.zero_grad()
        F.cross_entropy(m2(data), target).backward()
        o2.step()

    def nstep() -> None:  # compute alone
        o2.zero_grad()
        with m2.no_sync():
            F.cross_entropy(m2(data), target).backward()
        o2.step()

    fns = {"hvd": hstep, "ddp-gloo": dstep, "compute": nstep}
    if os.environ.get("AB_ALONE"):  # interleave the plan that packs big tensors too
        from unison.torch import fusion

        alone = fusion.ALONE_BYTES

        def hstep_fused() -> None:
            fusion.ALONE_BYTES = 1 << 62
            try:
                hstep()
            finally:
                fusion.ALONE_BYTES = alone

        fns["hvd-packall"] = hstep_fused
    for f in fns.values():
        for _ in range(2):
            f()
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
    detail = []
    per_thread: dict[str, dict[str, float]] = {}
    packs: dict[str, int] = {}
    for _ in range(iters):
        for k, f in fns.items():
            dist.barrier()
            EVENTS.clear()
            th0 = threads()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            f()
            t1 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            cs = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw
            res[k].append((t1 - t0, cpu, cs))
            th1 = threads()
            for name, v in th1.items():
                per_thread.setdefault(k, {}).setdefault(name, 0.0)
                per_thread[k][name] += (v - th0.get(name, 0.0)) / iters
            if k.startswith("hvd"):
                packs[k] = packs.get(k, 0) + sum(
                    1 for n, a, b, s in EVENTS if n == "wire" and s > (1 << 21) and s != 8388608
                )
            if k == "hvd":
                detail.append(
                    (marks["bw_end"] - t0, [(n, a - t0, b - a, s) for n, a, b, s in EVENTS])
                )
    if hvd.rank() == 0:
        for k, v in res.items():
            w = sorted(x[0] * 1e3 for x in v)
            print(
                f"{k:9s} wall min {w[0]:.1f} med {statistics.median(w):.1f} ms; "
                f"cpu med {statistics.median(x[1] for x in v) * 1e3:.1f} ms; "
                f"cs med {statistics.median(x[2] for x in v):.0f}"
            )
        print("big tensors packed with others (fc1.weight fused), all steps:", packs)
        for k, d in per_thread.items():
            print(k, {n: round(v * 1e3, 1) for n, v in d.items() if v > 0})
        for bw, evs in detail[-3:]:
            print(f"backward ends at {bw * 1e3:.1f} ms")
            for n, a, d, s in evs:
                print(f"   {n:4s} start {a * 1e3:7.1f} ms  took {d * 1e3:6.1f} ms  numel {s}")
    rank = hvd.rank()
    hvd.shutdown()
    if PROF is not None and rank == 0:
        import pstats

        pstats.Stats(PROF).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
