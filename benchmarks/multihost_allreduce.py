"""All-reduce bus bandwidth across two namespaced hosts, hierarchical vs flat ring.

Builds two network namespaces on one switch (``tests/hosts/bridged.py``; needs root and
iproute2), limits each host's NIC with tbf (``--rate``, default 1gbit), and runs
``unison run -np 4 -H h0:2,h1:2 --rsh 'ip netns exec {host}'`` twice, with
``UNISON_ALGO=all_reduce:ring`` and ``all_reduce:hierarchical``. Prints nccl-tests style
rows (algbw = bytes / time, busbw = algbw x 2(p-1)/p) and the hierarchical/flat ratio::

    sudo .venv/bin/python benchmarks/multihost_allreduce.py --rate 1gbit --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = [1 << 16, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def worker(iters: int) -> None:
    import numpy as np

    import unison as un

    un.init()
    p = un.size()
    rows = []
    for n in SIZES:
        x = np.ones(n // 4, np.float32)
        un.all_reduce(x)  # warm-up
        k = max(2, min(iters, (256 << 20) // n))
        un.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            un.all_reduce(x)
        t = np.array([(time.perf_counter() - t0) / k])
        un.all_reduce(t, op=un.ReduceOp.MAX)
        alg = n / t[0]
        rows.append(
            {"bytes": n, "time_s": float(t[0]), "algbw": alg, "busbw": alg * 2 * (p - 1) / p}
        )
    if un.rank() == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit", help="tbf rate of each host's NIC")
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.hosts.bridged import IFACE, BridgedHosts

    hosts = BridgedHosts(2)
    try:
        if args.rate:
            hosts.shape(args.rate)
        results = {}
        for algo in ("ring", "hierarchical"):
            env = dict(os.environ, UNISON_ALGO=f"all_reduce:{algo}", PYTHONPATH=str(ROOT))
            spec = ",".join(f"{n}:{args.per_host}" for n in hosts.names)
            cmd = [
                sys.executable, "-m", "unison.launch.cli", "run", "--no-prefix",
                "-np", str(2 * args.per_host), "-H", spec, "--rsh", "ip netns exec {host}",
                "--store-addr", hosts.launcher_addr, "--network-interface", IFACE,
                "--timeout", "120", sys.executable, __file__, "--worker", str(args.iters),
            ]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=580)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return out.returncode
            line = next(x for x in out.stdout.splitlines() if x.startswith("ROWS "))
            results[algo] = json.loads(line[5:])
    finally:
        hosts.close()
    print(f"2 hosts x {args.per_host} ranks, NIC {args.rate} (tbf); busbw in MB/s")
    print(f"{'bytes':>10} {'ring':>10} {'hier':>10} {'ratio':>7}")
    for flat, hier in zip(results["ring"], results["hierarchical"], strict=True):
        ratio = flat["time_s"] / hier["time_s"]
        print(
            f"{flat['bytes']:>10} {flat['busbw'] / 1e6:>10.1f} {hier['busbw'] / 1e6:>10.1f} "
            f"{ratio:>6.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rate": args.rate, **results}, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
