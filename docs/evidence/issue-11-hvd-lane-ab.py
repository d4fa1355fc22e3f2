"""Interleaved A/B in one job (issue 11, round 4): blocks of 4-byte hvd.allreduce with every
steady-state cycle exchanged point to point ("p2p", the round-3 path: pickled messages, one
send and one receive per peer) or gathered as fixed-size records in one lane all_gather
("lane", unison/torch/record.py), and Gloo dist.all_reduce. Per variant: [min, median] of the
per-op median of each block (us), and the median per op of [voluntary, involuntary context
switches, CPU us (this process, all threads), main-thread Python calls (CALLS=1)].

    unison run -np 2 python docs/evidence/issue-11-hvd-lane-ab.py      # N=200 B=8
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
N = int(os.environ.get("N", "200"))
B = int(os.environ.get("B", "8"))
CALLS = os.environ.get("CALLS") == "1"
for _ in range(50):
    hvd.allreduce(x, name="lat")
    dist.all_reduce(x)
kinds = ["p2p", "lane", "gloo"]
res: dict[str, list[float]] = {k: [] for k in kinds}
cs: dict[str, list[tuple[float, ...]]] = {k: [] for k in kinds}
calls = [0]


def _count(frame, event, arg):  # type: ignore[no-untyped-def]
    if event == "call":
        calls[0] += 1


def blk(k: str, f) -> None:  # type: ignore[no-untyped-def]
    dist.barrier()
    ts = []
    calls[0] = 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    if CALLS:
        sys.setprofile(_count)
    for _ in range(N):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    sys.setprofile(None)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    res[k].append(statistics.median(ts) * 1e6)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    cs[k].append(
        (
            (r1.ru_nvcsw - r0.ru_nvcsw) / N,
            (r1.ru_nivcsw - r0.ru_nivcsw) / N,
            cpu / N * 1e6,
            calls[0] / N,
        )
    )


for b in range(B):
    for k in ["p2p", "lane"] if b % 2 else ["lane", "p2p"]:
        eng.lanes.enabled = k == "lane"
        hvd.allreduce(x, name="lat")  # the cycle that sets the next one's mode
        blk(k, lambda: hvd.allreduce(x, name="lat"))
    blk("gloo", lambda: dist.all_reduce(x))
out: dict[str, object] = {k: [round(min(v)), round(statistics.median(v))] for k, v in res.items()}
out["csw_v_iv_cpu_calls"] = {
    k: [round(statistics.median(c[i] for c in v), 1) for i in range(4)] for k, v in cs.items()
}
out["lane_cycles"] = eng.counts["lane"]
print("RESULT", hvd.rank(), hvd.size(), json.dumps(out), flush=True)
hvd.shutdown()
