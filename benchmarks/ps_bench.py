"""The bottleneck: push+pull throughput through the parameter server vs all-reduce.

    python benchmarks/ps_bench.py --bytes 4M --workers 1 2 4 --servers 1 2

For each number of workers W and servers S it runs ``unison run -np W+S --servers S``
where every worker pushes and then pulls one float32 tensor of ``--bytes`` (split
over all servers) ``--iters`` times under ASP, and, for the same W, an all-reduce
of the same bytes on W ranks. It reports the mean step time of worker 0 and the
aggregate bytes per second that go through the servers (W x 2 x bytes per step);
for all-reduce, the same bytes per step divided by its time (what each rank gets
done per second, comparable with one worker's push+pull). Writes
``benchmarks/results/ps_bench.md`` and ``ps_bench.png`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _size(text: str) -> int:
    t = text.upper()
    for s, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(s):
            return int(float(t[:-1]) * m)
    return int(t)


def child(mode: str, nbytes: int, iters: int, out: str) -> None:
    x = np.ones(nbytes // 4, np.float32)
    if mode == "ps":
        import unison.ps as ps

        kv = ps.init(ps.ASP(), split_bytes=1 << 16)
        kv.init_params({"x": x})
        kv.set_optimizer(ps.Sum())
        kv.barrier()
        kv.push({"x": x})  # warm-up
        kv.pull({"x": x})
        t0 = time.perf_counter()
        for _ in range(iters):
            kv.push({"x": x})
            kv.pull({"x": x})
        dt = (time.perf_counter() - t0) / iters
        kv.barrier()
        if kv.rank == 0:
            with open(out, "w") as f:
                json.dump({"step": dt, "servers": kv.num_servers, "workers": kv.num_workers}, f)
        kv.close()
    else:
        import unison as un

        un.init()
        un.all_reduce(x)
        un.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            un.all_reduce(x)
        dt = (time.perf_counter() - t0) / iters
        if un.rank() == 0:
            with open(out, "w") as f:
                json.dump({"step": dt, "workers": un.size()}, f)
        un.shutdown()


def launch(mode: str, np_: int, servers: int, nbytes: int, iters: int, out: str) -> dict:
    cmd = [sys.executable, "-m", "unison.launch.cli", "run", "-np", str(np_)]
    if servers:
        cmd += ["--servers", str(servers)]
    cmd += [sys.executable, __file__, "--child", mode, "--bytes", str(nbytes)]
    cmd += ["--iters", str(iters), "--out", out]
    subprocess.run(cmd, check=True, timeout=300)
    with open(out) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", default="4M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--child", choices=["ps", "allreduce"])
    ap.add_argument("--out", default="")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--label", default=f"{os.cpu_count()}-core host")
    args = ap.parse_args()
    nbytes = _size(args.bytes)
    if args.child:
        child(args.child, nbytes, args.iters, args.out)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workers:
            for s in args.servers:
                r = launch("ps", w + s, s, nbytes, args.iters, os.path.join(tmp, "r.json"))
                rows.append(("ps", w, s, r["step"], w * 2 * nbytes / r["step"]))
                print(rows[-1], flush=True)
            if w > 1:
                r = launch("allreduce", w, 0, nbytes, args.iters, os.path.join(tmp, "r.json"))
                rows.append(("allreduce", w, 0, r["step"], w * nbytes / r["step"]))
                print(rows[-1], flush=True)
    mib = nbytes / (1 << 20)
    lines = [
        f"Measured by `python benchmarks/ps_bench.py` on a {args.label}: {mib:g} MiB float32 "
        f"per worker per step, {args.iters} steps, ASP, mean step time of worker 0.",
        "",
        "| method | workers | servers | step (ms) | per-worker MiB/s | aggregate MiB/s |",
        "|---|---|---|---|---|---|",
    ]
    for kind, w, s, step, agg in rows:
        name = "PS push+pull" if kind == "ps" else "all-reduce"
        lines.append(
            f"| {name} | {w} | {s or '-'} | {step * 1e3:.1f} | {mib / step:.0f} | "
            f"{agg / (1 << 20):.0f} |"
        )
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "ps_bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n\n![throughput](ps_bench.png)\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in args.servers:
        pts = [(w, mib / st) for k, w, sv, st, _ in rows if k == "ps" and sv == s]
        ax.plot(*zip(*pts, strict=True), marker="o", label=f"PS, {s} server(s)")
    pts = [(w, mib / st) for k, w, _, st, _ in rows if k == "allreduce"]
    if pts:
        ax.plot(*zip(*pts, strict=True), marker="s", label="all-reduce")
    ax.set_xlabel("workers")
    ax.set_ylabel("MiB/s per worker (bytes / step time)")
    ax.set_title(f"{mib:g} MiB per step, {args.label}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "ps_bench.png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
