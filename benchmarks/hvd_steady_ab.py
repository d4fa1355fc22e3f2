"""Interleaved A/B in one job (issue 11, round 5): blocks of 4-byte ``hvd.allreduce`` on the
steady path ("steady", unison/horovod/steady.py: one gathered cycle on the caller's thread,
no handle), on the round-4 general gathered cycle ("cycle", the same job with the steady
path switched off) and Gloo ``dist.all_reduce`` ("gloo"), alternated block by block.

Per variant: [min, median] over blocks of each block's per-op median (us, this rank), and
the median per op of [voluntary, involuntary context switches, process CPU us (all
threads, getrusage), main-thread CPU us (time.thread_time), main-thread Python calls
(CALLS=1 only; times of such a run are inflated by the hook)]. The lead's quiet-machine
run: wall figures are the product's speed only there.

    unison run -np 2 python benchmarks/hvd_steady_ab.py     # N=500 B=8
    unison run -np 4 python benchmarks/hvd_steady_ab.py
"""

import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import unison.torch as hvd
from unison.torch.basics import engine_of

hvd.init()
torch.set_num_threads(1)
eng = engine_of(hvd.global_process_set)
steady = eng.steady
port = 0
if hvd.rank() == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
port = hvd.broadcast_object(port, 0, name="gloo.port")
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
)
x = torch.zeros(1)
N = int(os.environ.get("N", "500"))
B = int(os.environ.get("B", "8"))
CALLS = os.environ.get("CALLS") == "1"
for _ in range(100):
    hvd.allreduce(x, name="lat")
    dist.all_reduce(x)
kinds = ["cycle", "steady", "gloo"]
res: dict[str, list[float]] = {k: [] for k in kinds}
cs: dict[str, list[tuple[float, ...]]] = {k: [] for k in kinds}
calls = [0]


def _count(frame, event, arg):  # type: ignore[no-untyped-def]
    if event in ("call", "c_call"):
        calls[0] += 1


def blk(k: str, f) -> None:  # type: ignore[no-untyped-def]
    dist.barrier()
    ts = []
    calls[0] = 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    th0 = time.thread_time()
    if CALLS:
        sys.setprofile(_count)
    for _ in range(N):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    sys.setprofile(None)
    th1 = time.thread_time()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    res[k].append(statistics.median(ts) * 1e6)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    cs[k].append(
        (
            (r1.ru_nvcsw - r0.ru_nvcsw) / N,
            (r1.ru_nivcsw - r0.ru_nivcsw) / N,
            cpu / N * 1e6,
            (th1 - th0) / N * 1e6,
            calls[0] / N,
        )
    )


taken0 = steady.taken if steady is not None else 0
for b in range(B):
    for k in ["cycle", "steady"] if b % 2 else ["steady", "cycle"]:
        eng.steady = steady if k == "steady" else None
        blk(k, lambda: hvd.allreduce(x, name="lat"))
    blk("gloo", lambda: dist.all_reduce(x))
eng.steady = steady
out: dict[str, object] = {k: [round(min(v)), round(statistics.median(v))] for k, v in res.items()}
out["csw_v_iv_cpu_thread_calls"] = {
    k: [round(statistics.median(c[i] for c in v), 1) for i in range(5)] for k, v in cs.items()
}
out["steady_taken"] = (steady.taken - taken0) if steady is not None else None
out["steady_fell_back"] = steady.fell_back if steady is not None else None
out["load"] = os.getloadavg()[0]
print("RESULT", hvd.rank(), hvd.size(), json.dumps(out), flush=True)
hvd.shutdown()
