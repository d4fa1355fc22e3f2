"""Counts per 4-byte ``hvd.allreduce`` (issue 11): Python calls per thread, cycles, cycles
on the caller's thread, context switches and CPU time per op. Counts, not timings, are
the evidence on a loaded machine.

    unison run -np 2 python docs/evidence/issue-11-hvd-profile.py     # N=300 by default
    CPROF=1 SORT=cumtime unison run -np 2 python docs/evidence/issue-11-hvd-profile.py
"""

import cProfile
import io
import json
import os
import pstats
import resource
import sys
import threading
import time

import torch

import unison.torch as hvd
from unison.torch.basics import engine_of

N = int(os.environ.get("N", "300"))
ON = [False]
calls: dict[str, int] = {}


def _count(frame, event, arg):  # type: ignore[no-untyped-def]
    if ON[0] and event in ("call", "c_call"):
        t = threading.current_thread()
        name = "main" if t is threading.main_thread() else t.name
        calls[name] = calls.get(name, 0) + 1


threading.setprofile(_count)  # every thread started from here on (the engine's)
hvd.init()
torch.set_num_threads(1)
eng = engine_of(hvd.global_process_set)
x = torch.zeros(1)
for _ in range(50):
    hvd.allreduce(x, name="lat")
hvd.barrier()

c0 = dict(eng.counts)
ON[0] = True
sys.setprofile(_count)
for _ in range(N):
    hvd.allreduce(x, name="lat")
sys.setprofile(None)
ON[0] = False
c1 = dict(eng.counts)
hvd.barrier()

ru0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
for _ in range(N):
    hvd.allreduce(x, name="lat")
us = (time.perf_counter() - t) / N * 1e6
ru1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
print(
    json.dumps(
        {
            "rank": hvd.rank(),
            "np": hvd.size(),
            "us": round(us, 1),
            "main_calls_per_op": round(calls.get("main", 0) / N, 1),
            "other_calls_per_op": {k: round(v / N, 1) for k, v in calls.items() if k != "main"},
            "cycles_per_op": (c1["cycles"] - c0["cycles"]) / N,
            "caller_per_op": (c1["caller"] - c0["caller"]) / N,
            "vcsw_per_op": (ru1.ru_nvcsw - ru0.ru_nvcsw) / N,
            "ivcsw_per_op": (ru1.ru_nivcsw - ru0.ru_nivcsw) / N,
            "cpu_us_per_op": round(cpu / N * 1e6, 1),
        }
    ),
    flush=True,
)
if os.environ.get("CPROF"):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(N):
        hvd.allreduce(x, name="lat")
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(os.environ.get("SORT", "tottime")).print_stats(40)
    print(s.getvalue())
hvd.shutdown()
