"""Issue 15: how long after a peer's death a rank waiting in a point-to-point negotiation
cycle reports it, and the CPU that rank spends waiting for a slow (live) peer.

    OLD=1 unison run -np 2 python benchmarks/loss_detect.py   # 1 s checks
    unison run -np 2 python benchmarks/loss_detect.py         # now

Rank 1 idles 2 s (rank 0 waits for it: CPU per second of waiting), then makes one more
call, writes the time and exits abruptly while rank 0 waits in the next cycle (a new
name: negotiated point to point). Rank 0 prints the delay from rank 1's exit to its error.
"""

import os
import resource
import sys
import time

import torch

import unison.torch as hvd
from unison.horovod import channel
from unison.horovod import engine as exchange

if os.environ.get("OLD") == "1":  # the previous constants
    channel._CHECK_S = 1.0
    exchange.SLICE_S = 1.0
hvd.init()
torch.set_num_threads(1)
stamp = f"/tmp/issue15-{os.getppid()}.t"
for i in range(3):
    hvd.allreduce(torch.ones(1), name=f"warm{i}")
if hvd.rank() == 1:
    time.sleep(2.0)
    hvd.allreduce(torch.ones(1), name="slow")
    time.sleep(0.3)
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.monotonic()
hvd.allreduce(torch.ones(1), name="slow")
r1 = resource.getrusage(resource.RUSAGE_SELF)
waited = time.monotonic() - t0
cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
try:
    hvd.allreduce(torch.ones(1), name="after-death")
    print("RESULT no error", flush=True)
except hvd.HorovodInternalError as exc:
    t = time.time()
    with open(stamp) as f:
        died = float(f.read())
    os.unlink(stamp)
    print(
        f"RESULT waited {waited:.2f}s for the slow peer, CPU {cpu / waited * 1000:.1f} ms/s, "
        f"wake-ups {(r1.ru_nvcsw - r0.ru_nvcsw) / waited:.0f}/s; loss reported "
        f"{(t - died) * 1000:.0f} ms after the exit: {str(exc)[:100]}",
        flush=True,
    )
sys.stdout.flush()
os._exit(0)
