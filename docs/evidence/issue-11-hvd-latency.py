"""4-byte hvd.allreduce against torch.distributed's Gloo dist.all_reduce in the same job,
B interleaved blocks of N ops each; rank 0 prints [min, median] microseconds per op.

    unison run -np 2 python docs/evidence/issue-11-hvd-latency.py     # N=200 B=7
"""
import os, socket, statistics, time, json
import torch, torch.distributed as dist
import unison.torch as hvd
hvd.init(); torch.set_num_threads(1)
port = 0
if hvd.rank() == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
port = hvd.broadcast_object(port, 0, name="gloo.port")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())
x = torch.zeros(1)
N = int(os.environ.get("N", "200")); B = int(os.environ.get("B", "7"))
for _ in range(50): hvd.allreduce(x, name="lat"); dist.all_reduce(x)
res = {"hvd": [], "gloo": []}
for b in range(B):
    dist.barrier()
    t = time.perf_counter()
    for _ in range(N): hvd.allreduce(x, name="lat")
    res["hvd"].append((time.perf_counter() - t) / N * 1e6)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(N): dist.all_reduce(x)
    res["gloo"].append((time.perf_counter() - t) / N * 1e6)
if hvd.rank() == 0:
    print("RESULT", os.environ.get("TAG", ""), hvd.size(), json.dumps({k: [round(min(v)), round(statistics.median(v))] for k, v in res.items()}), flush=True)
dist.destroy_process_group()
hvd.shutdown()
