"""How much a steady-state cycle could save (issue 11): blocks of 4-byte hvd.allreduce interleaved
with the native lane's blocking all_reduce (4 bytes) and all_gather (8 bytes per rank) on a
group of the same ranks; rank-wise [min, median] us per op and median CPU us per op.

    unison run -np 4 python docs/evidence/issue-11-hvd-lane.py
"""
import os, statistics, time, json, resource
import numpy as np, torch
import unison as un
import unison.torch as hvd
from unison.torch.basics import engine_of
hvd.init(); torch.set_num_threads(1)
eng = engine_of(hvd.global_process_set)
g = un.new_group(list(range(hvd.size())))
x = torch.zeros(1); a = np.zeros(1, np.float32); b = np.zeros(8, np.uint8); out = np.zeros(32, np.uint8)
N = 100; B = 5
def lane(): un.all_reduce(a, group=g)
def gath(): un.all_gather_into_tensor(out, b, group=g)
for _ in range(50): hvd.allreduce(x, name="lat"); lane(); gath()
res = {"hvd": [], "lane_allreduce": [], "lane_allgather": []}; cpu = {k: [] for k in res}
fs = {"hvd": lambda: hvd.allreduce(x, name="lat"), "lane_allreduce": lane, "lane_allgather": gath}
for _ in range(B):
    for k, f in fs.items():
        hvd.barrier(); r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
        for _ in range(N): f()
        res[k].append((time.perf_counter() - t) / N * 1e6); r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu[k].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / N * 1e6)
print("RESULT", hvd.rank(), json.dumps({k: [round(min(v)), round(statistics.median(v)), round(statistics.median(cpu[k]))] for k, v in res.items()}), flush=True)
