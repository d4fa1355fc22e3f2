"""Step time of one unchanged DDP script under ``unison run`` and under ``torchrun``.

The script (this file with ``--rank``) is plain torch.distributed: ``env://`` init on
Gloo, a small MLP in DistributedDataParallel, SGD; it sets no thread count. It is run
with ``-np N`` by each launcher in turn, ``--repeats`` times, and the median time of
``--steps`` steps (after ``--warmup``) is reported with the load average around the
runs. Both launchers give a host's ranks a share of its cores as their thread count
(torchrun: ``OMP_NUM_THREADS=1``; unison run: cores / local ranks), so the two times
should agree; a big gap means one of them leaves the ranks' threads fighting.

    python benchmarks/ddp_step_launchers.py -np 2
    python benchmarks/ddp_step_launchers.py -np 2 --launchers unison   # one only
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rank_main(steps: int, warmup: int, width: int, batch: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        threads = torch.get_num_threads()
        print(f"DDP_STEPS_S {elapsed:.6f} threads={threads}", flush=True)
    dist.destroy_process_group()


def _command(launcher: str, np: int, script_args: list[str]) -> list[str]:
    me = [sys.executable, os.path.abspath(__file__), "--rank", *script_args]
    if launcher == "unison":
        return [sys.executable, "-m", "unison", "run", "-np", str(np), *me]
    torchrun = shutil.which("torchrun") or "torchrun"
    return [torchrun, "--standalone", "--nproc-per-node", str(np), *me[1:]]


def _one(launcher: str, np: int, script_args: list[str]) -> tuple[float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)  # "unchanged": what each launcher does by itself
    r = subprocess.run(
        _command(launcher, np, script_args), capture_output=True, text=True, env=env, timeout=600
    )
    m = re.search(r"DDP_STEPS_S (\S+) threads=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise SystemExit(
            f"{launcher} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        )
    return float(m.group(1)), m.group(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-np", type=int, default=2, help="ranks (on this host)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=256, help="MLP width")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--launchers", default="unison,torchrun", help="comma-separated")
    args = ap.parse_args()
    if args.rank:
        rank_main(args.steps, args.warmup, args.width, args.batch)
        return
    script_args = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--width",
                   str(args.width), "--batch", str(args.batch)]  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    before = os.getloadavg()
    print(f"# {args.np} ranks on one host with {cores} usable cores; {args.steps} DDP steps "
          f"(MLP {args.width}, batch {args.batch}), median of {args.repeats}")  # fmt: skip
    print(f"# load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}")
    rows = []
    for launcher in args.launchers.split(","):
        times = []
        threads = "?"
        for _ in range(args.repeats):
            t, threads = _one(launcher, args.np, script_args)
            times.append(t)
        rows.append((launcher, statistics.median(times), min(times), max(times), threads))
    after = os.getloadavg()
    print(
        f"{'launcher':<10} {'threads':>7} {'median s':>9} {'ms/step':>8} {'min s':>8} {'max s':>8}"
    )
    for launcher, med, lo, hi, threads in rows:
        print(f"{launcher:<10} {threads:>7} {med:>9.3f} {1000 * med / args.steps:>8.2f} "
              f"{lo:>8.3f} {hi:>8.3f}")  # fmt: skip
    if len(rows) == 2:
        print(f"# {rows[0][0]} / {rows[1][0]}: {rows[0][1] / rows[1][1]:.2f}x")
    print(f"# load average after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")


if __name__ == "__main__":
    main()
