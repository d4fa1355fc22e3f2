"""Python calls per blocking 8-byte collective (issue 11, round 5): cProfile around N
back-to-back calls after 200 warm-up calls, on rank 0, divided by N; "outside waiting"
leaves out the wait loop's own calls (clock, sched_yield, futex, the wait policy), whose
number depends on how long the peer takes. With LIST=1 the functions and their calls per op.

    unison run -np 2 python docs/evidence/issue-11-calls.py          # N=2000
    python docs/evidence/issue-11-calls.py                            # np=1
"""

import cProfile
import os
import pstats

import numpy as np

import unison as un

un.init()
N = int(os.environ.get("N", "2000"))
p = un.size()
x = np.ones(2, np.float32)
small = np.ones(max(1, 2 // p), np.float32) if 2 % p == 0 else np.ones(1, np.float32)
gathered = np.empty(small.size * p, np.float32)
scattered = np.empty(small.size, np.float32)
full = np.ones(small.size * p, np.float32)
OPS = {
    "all_reduce": lambda: un.all_reduce(x),
    "broadcast": lambda: un.broadcast(x, 0),
    "all_gather_into_tensor": lambda: un.all_gather_into_tensor(gathered, small),
    "reduce_scatter_tensor": lambda: un.reduce_scatter_tensor(scattered, full),
    "barrier": lambda: un.barrier(),
}
WAITING = (  # the wait loop and its failure checks (once per millisecond of waiting)
    *("monotonic", "sched_yield", "wait", "observe", "_epoch", "check_failures", "check"),
    *("gone", "broken", "_foreign", "unexpected_sigs", "extend", "min", "max", "byref"),
)
for name, f in OPS.items():
    for _ in range(200):
        f()
    un.barrier()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        f()
    prof.disable()
    st = pstats.Stats(prof)
    total = outside = 0.0
    rows = []
    for (file, _line, func), (_cc, nc, *_rest) in st.stats.items():  # type: ignore[attr-defined]
        if func == "<lambda>" and file == __file__:
            continue  # this script's own call per op
        total += nc
        waiting = func in WAITING or "sched_yield" in func or "monotonic" in func
        if not waiting:
            outside += nc
        rows.append((nc / N, func, os.path.basename(file)))
    if un.rank() == 0:
        print(f"np={p} {name}: {total / N:.1f} calls per op, {outside / N:.1f} outside waiting")
        if os.environ.get("LIST"):
            for per, func, file in sorted(rows, reverse=True):
                if per >= 0.01:
                    print(f"    {per:6.2f}  {func}  ({file})")
