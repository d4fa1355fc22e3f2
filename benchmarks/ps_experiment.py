"""BSP, SSP(1), SSP(3) and ASP on the digits classifier with one worker 2x slower.

    python benchmarks/ps_experiment.py            # writes benchmarks/results/ps_digits.{png,md}

Runs ``examples/ps_digits.py`` under ``unison run -np 6 --servers 2`` (4 workers,
2 servers) once per mode with ``--straggler 3:2``, then plots worker 0's training
loss against wall-clock time and against its clock (one line per mode) and writes
a table: time for worker 0 to see the target loss, the clock at which it did, the
final test accuracy and the job's time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [
    ("BSP", ["--consistency", "bsp"]),
    ("SSP(1)", ["--consistency", "ssp", "--staleness", "1"]),
    ("SSP(3)", ["--consistency", "ssp", "--staleness", "3"]),
    ("ASP", ["--consistency", "asp"]),
]


def run_mode(extra: list[str], common: list[str], out: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "unison.launch.cli",
        "run",
        "-np",
        "6",
        "--servers",
        "2",
        "--timeout",
        "60",
        sys.executable,
        os.path.join(HERE, "..", "examples", "ps_digits.py"),
        *extra,
        *common,
        "--out",
        out,
    ]
    subprocess.run(cmd, check=True, timeout=120)
    with open(out) as f:
        return json.load(f)


def first_reach(curve: list[list[float]], target: float) -> tuple[float, int] | None:
    for t, clock, loss in curve:
        if loss <= target:
            return t, int(clock)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-loss", type=float, default=0.2)
    ap.add_argument("--straggler", default="3:2")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    common = [
        "--straggler",
        args.straggler,
        "--steps",
        str(args.steps),
        "--compute-ms",
        str(args.compute_ms),
    ]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for label, extra in MODES:
                out = os.path.join(tmp, f"{label}-{rep}.json")
                results.setdefault(label, []).append(run_mode(extra, common, out))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, runs in results.items():
        t, c, loss = zip(*runs[0]["curve"], strict=False)
        a1.plot(t, loss, label=label)
        a2.plot(c, loss, label=label)
    for ax, xl in ((a1, "wall-clock time (s)"), (a2, "worker 0 clock")):
        ax.axhline(args.target_loss, color="gray", lw=0.8, ls="--")
        ax.set_xlabel(xl)
        ax.set_ylabel("training loss (worker 0's view)")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle(
        f"digits MLP, 4 workers + 2 servers, worker 3 {args.straggler.split(':')[1]}x slower"
    )
    fig.tight_layout()
    os.makedirs(args.results, exist_ok=True)
    png = os.path.join(args.results, "ps_digits.png")
    fig.savefig(png, dpi=110)

    head = f"| mode | time to loss <= {args.target_loss:g} (s) | at clock | final train loss |"
    rows = [head + " test accuracy | job time (s) |", "|---|---|---|---|---|---|"]
    for label, runs in results.items():
        reach = [first_reach(r["curve"], args.target_loss) for r in runs]
        ok = [x for x in reach if x is not None]
        tt = sum(x[0] for x in ok) / len(ok) if ok else float("nan")
        cc = sum(x[1] for x in ok) / len(ok) if ok else float("nan")
        fl = sum(r["final_loss"] for r in runs) / len(runs)
        acc = sum(r["test_accuracy"] for r in runs) / len(runs)
        jt = sum(r["total_time"] for r in runs) / len(runs)
        rows.append(f"| {label} | {tt:.2f} | {cc:.0f} | {fl:.4f} | {acc:.4f} | {jt:.2f} |")
    table = "\n".join(rows)
    with open(os.path.join(args.results, "ps_digits.md"), "w") as f:
        f.write(
            f"Measured by `python benchmarks/ps_experiment.py` ({args.repeats} run(s) per mode, "
            f"mean; {args.steps} steps per worker, {args.compute_ms:g} ms emulated compute, "
            f"straggler {args.straggler}).\n\n{table}\n\n![loss curves](ps_digits.png)\n"
        )
    print(table)
    print("wrote", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
