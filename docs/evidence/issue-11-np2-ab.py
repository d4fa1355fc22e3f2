"""Old tree vs new tree, alternating jobs (issue 11, round 5): blocking 8-byte collectives.

Driver: for ROUNDS rounds, runs this file as a job (``unison run -np NP``) under each tree
in turn (PYTHONPATH), and prints per tree and op the min and median over all blocks of the
slowest rank's mean us per call, and the median CPU us per call (``time.thread_time``, the
calling thread, mean over ranks), which load disturbs far less than wall time.

    git worktree add /tmp/old 960eecc
    python docs/evidence/issue-11-np2-ab.py /tmp/old . --np 2 --rounds 4
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def job() -> None:
    import unison as un

    un.init()
    n, blocks, p = int(os.environ["N"]), int(os.environ["B"]), un.size()
    x = np.ones(2, np.float32)
    small = np.ones(1, np.float32)
    gathered = np.empty(p, np.float32)
    scattered = np.empty(1, np.float32)
    full = np.ones(p, np.float32)
    ops = {
        "all_reduce": lambda: un.all_reduce(x),
        "broadcast": lambda: un.broadcast(x, 0),
        "all_gather": lambda: un.all_gather_into_tensor(gathered, small),
        "reduce_scatter": lambda: un.reduce_scatter_tensor(scattered, full),
        "barrier": un.barrier,
    }
    out: dict[str, list[list[float]]] = {}
    for name, f in ops.items():
        for _ in range(300):
            f()
        rows = []
        for _ in range(blocks):
            un.barrier()
            c, t = time.thread_time(), time.perf_counter()
            for _ in range(n):
                f()
            t, c = time.perf_counter() - t, time.thread_time() - c
            every = np.zeros(2 * p)
            un.all_gather_into_tensor(every, np.array([t / n * 1e6, c / n * 1e6]))
            every = every.reshape(p, 2)
            rows.append([float(every[:, 0].max()), float(every[:, 1].mean())])
        out[name] = rows
    if un.rank() == 0:
        print("ROWS " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    got: dict[str, dict[str, list[list[float]]]] = {t: {} for t in a.trees}
    for r in range(a.rounds):
        for tree in a.trees if r % 2 == 0 else a.trees[::-1]:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), N=str(a.calls))
            env["B"] = str(a.blocks)
            cmd = [sys.executable, "-m", "unison", "run", "-np", str(a.np), sys.executable]
            res = subprocess.run(
                [*cmd, os.path.abspath(__file__), "--job"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            line = next((ln for ln in res.stdout.splitlines() if "ROWS " in ln), None)
            if line is None:
                print(res.stdout[-2000:], res.stderr[-2000:])
                continue
            for op, rows in json.loads(line.split("ROWS ", 1)[1]).items():
                got[tree].setdefault(op, []).extend(rows)
    print(f"np={a.np} rounds={a.rounds} calls={a.calls} load={os.getloadavg()[0]:.1f}")
    for op in next(iter(got.values())):
        for tree in a.trees:
            rows = got[tree].get(op, [])
            if rows:
                wall = [r[0] for r in rows]
                cpu = statistics.median(r[1] for r in rows)
                print(
                    f"{op:15s} {tree:20s} min {min(wall):7.1f}  median "
                    f"{statistics.median(wall):7.1f} us   cpu {cpu:6.2f} us"
                )


if __name__ == "__main__":
    if "--job" in sys.argv:
        job()
    else:
        main()
