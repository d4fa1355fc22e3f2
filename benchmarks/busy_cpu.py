"""Collectives on a busy CPU: unison, Gloo and OpenMPI side by side with k busy-loop
processes running beside the job.

Training hosts are never idle (data-loader workers, intra-op threads). For each world
size and each number of hogs k, this starts k processes that spin in pure Python at the
default priority, runs ``unison bench --compare gloo,mpi`` (each implementation in turn,
all three under the same hogs), stops the hogs and prints one Markdown table:

    python benchmarks/busy_cpu.py                        # np 2 and 4, k = 0, 1, 2, 4
    python benchmarks/busy_cpu.py --np 2 --hogs 1 --json busy.json

Columns: time per call of each implementation (``unison bench``'s figure), × Gloo (Gloo's
time over unison's: > 1 means unison is faster) and unison ÷ OpenMPI (unison's time over
OpenMPI's). Start it on a quiet machine: the hogs are meant to be the only other work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOG = "while True:\n    pass\n"


def measure(np_: int, hogs: int, ops: str, sizes: str, extra: list[str]) -> dict:
    """One ``unison bench`` run with ``hogs`` busy loops beside it; its JSON document."""
    spinners = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bench.json"
            cmd = ["unison", "bench", "-np", str(np_), "--ops", ops, "--sizes", sizes,
                   "--compare", "gloo,mpi", "--json", str(out), *extra]  # fmt: skip
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
            return json.loads(out.read_text())
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def size_label(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def table(runs: list[tuple[int, int, dict]]) -> str:
    lines = [
        "| np | hogs | op | size | unison µs | Gloo µs | OpenMPI µs | × Gloo | unison ÷ OpenMPI |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for np_, hogs, doc in runs:
        rows = {
            (r["impl"], r["op"], r["size"]): r["time_us"] for r in doc["rows"] if "time_us" in r
        }
        for impl, op, size in sorted(k for k in rows if k[0] == "unison"):
            u, g, m = (
                rows[(impl, op, size)],
                rows.get(("gloo", op, size)),
                rows.get(("mpi", op, size)),
            )
            lines.append(
                f"| {np_} | {hogs} | {op} | {size_label(size)} | {u:.1f} | "
                + (f"{g:.1f}" if g else "–") + " | " + (f"{m:.1f}" if m else "–") + " | "
                + (f"{g / u:.2f}" if g else "–") + " | " + (f"{u / m:.1f}" if m else "–") + " |"
            )  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 1, 2, 4])
    ap.add_argument("--ops", default="all_reduce,broadcast")
    ap.add_argument("--sizes", default="8,64K")
    ap.add_argument("--json", help="write every run's bench document here")
    ap.add_argument("bench_args", nargs="*", help="passed to unison bench (after --)")
    args = ap.parse_args()
    runs = []
    for np_ in args.np:
        for k in args.hogs:
            print(f"np={np_} hogs={k} ...", file=sys.stderr, flush=True)
            runs.append((np_, k, measure(np_, k, args.ops, args.sizes, args.bench_args)))
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"np": n, "hogs": k, "bench": d} for n, k, d in runs])
        )
    print(f"Machine: {os.cpu_count()} CPUs; hogs are pure-Python busy loops at nice 0.\n")
    print(table(runs))


if __name__ == "__main__":
    main()
