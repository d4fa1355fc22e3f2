"""Interleaved A/B in one job (issue 11): blocks of 4-byte hvd.allreduce with the cycle thread
waiting for peer messages by spinning/yielding ("spin") or asleep ("sleep", the default where
ranks outnumber cores), and Gloo dist.all_reduce; per variant [min, median] us per op and the
median [voluntary, involuntary context switches, CPU us] per op.

    unison run -np 4 python docs/evidence/issue-11-hvd-wait-ab.py      # N=100 B=6
"""
import os, socket, statistics, time, json, resource
import torch, torch.distributed as dist
import unison.torch as hvd
from unison.torch.basics import engine_of
hvd.init(); torch.set_num_threads(1)
port = 0
if hvd.rank() == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
port = hvd.broadcast_object(port, 0, name="gloo.port")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())
x = torch.zeros(1)
N = int(os.environ.get("N", "100")); B = int(os.environ.get("B", "6"))
for _ in range(50): hvd.allreduce(x, name="lat"); dist.all_reduce(x)
res = {"spin": [], "sleep": [], "gloo": []}; cs = {"spin": [], "sleep": [], "gloo": []}
def blk(k, f):
    dist.barrier(); r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
    for _ in range(N): f()
    res[k].append((time.perf_counter() - t) / N * 1e6); r1 = resource.getrusage(resource.RUSAGE_SELF)
    cs[k].append(((r1.ru_nvcsw-r0.ru_nvcsw)/N, (r1.ru_nivcsw-r0.ru_nivcsw)/N, (r1.ru_utime+r1.ru_stime-r0.ru_utime-r0.ru_stime)/N*1e6))
for b in range(B):
    for k in (["spin", "sleep"] if b % 2 else ["sleep", "spin"]):
        engine_of(hvd.global_process_set).channel.sleep_wait = k == "sleep"; dist.barrier()
        blk(k, lambda: hvd.allreduce(x, name="lat"))
    blk("gloo", lambda: dist.all_reduce(x))
out = {k: [round(min(v)), round(statistics.median(v))] for k, v in res.items()}
out["csw_v_iv_cpu"] = {k: [round(statistics.median(c[i] for c in v), 1) for i in range(3)] for k, v in cs.items()}
print("RESULT", hvd.rank(), hvd.size(), json.dumps(out), flush=True)
