"""The benchmark's outputs, in nccl-tests' habits: one line per row as it is measured,
the average bus bandwidth, the table of unison against its peers (with a legend for
its ratio columns), JSON and the plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "avg_busbw",
    "human",
    "legend",
    "plot",
    "row_header",
    "row_line",
    "summary_line",
    "table",
    "write_json",
]


def human(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def row_header(impl: str, np_: int, dtype: str) -> str:
    """The header printed before an implementation's first row."""
    return (
        f"# {impl}: np={np_}, {dtype}; time in µs, algbw and busbw in GB/s\n"
        f"# {'op':>14} {'size':>8} {'count':>11} {'time':>10} {'algbw':>7} {'busbw':>7} "
        f"{'#wrong':>6}"
    )


def row_line(row: dict[str, Any]) -> str:
    """One measured (or skipped) row, printed as soon as it arrives."""
    lead = f"  {row['op']:>14} {human(row['size']):>8}"
    if "time_us" not in row:
        return f"{lead} {'':>11} skipped: {row.get('skipped', 'no result')}"
    correct = row.get("correct")
    wrong = "N/A" if correct is None else ("0" if correct else "WRONG")
    algbw, busbw = (f"{row['algbw']:.2f}", f"{row['busbw']:.2f}") if row["size"] else ("-", "-")
    return (
        f"{lead} {row.get('count', 0):>11} {row['time_us']:>10.1f} {algbw:>7} {busbw:>7} {wrong:>6}"
    )


def avg_busbw(rows: Sequence[dict[str, Any]], impl: str) -> float | None:
    """nccl-tests' "Avg bus bandwidth": the mean bus bandwidth over ``impl``'s measured
    rows that carry a payload (a barrier has none); None when there are none."""
    bws = [r["busbw"] for r in rows if r["impl"] == impl and "busbw" in r and r["size"] > 0]
    return sum(bws) / len(bws) if bws else None


def summary_line(rows: Sequence[dict[str, Any]], impl: str) -> str:
    avg = avg_busbw(rows, impl)
    wrong = sum(1 for r in rows if r["impl"] == impl and r.get("correct") is False)
    bw = f"{avg:.3f} GB/s" if avg is not None else "n/a (no payload)"
    return f"# {impl}: Avg bus bandwidth : {bw}; wrong results: {wrong}"


def legend(peers: Sequence[str]) -> str:
    """What the ``x<peer>`` columns of :func:`table` mean."""
    cols = ", ".join(f"x{p}" for p in peers)
    return (
        f"# {cols}: the peer's time divided by unison's at that size "
        "(> 1: unison is faster; for a row with a payload, also unison's busbw over the peer's)"
    )


def _cell(row: dict[str, Any] | None) -> tuple[str, str, str]:
    if row is None:
        return ("-", "-", "-")
    if "skipped" in row:
        return ("n/a", "", "")
    mark = "" if row.get("correct", True) else "!"
    return (f"{row['time_us']:.1f}{mark}", f"{row['algbw']:.2f}", f"{row['busbw']:.2f}")


def table(rows: Sequence[dict[str, Any]], impls: Sequence[str], np_: int) -> str:
    """One block per operation: size, count, then time/algbw/busbw per implementation and
    the ratios of unison's speed to each peer's, the peer's time over unison's (>1: unison
    is faster; for a row with a payload the same as the ratio of bus bandwidths)."""
    by = {(r["impl"], r["op"], r["size"]): r for r in rows}
    ops = list(dict.fromkeys(r["op"] for r in rows))
    peers = [i for i in impls if i != "unison"]
    out = []
    for op in ops:
        sizes = sorted({r["size"] for r in rows if r["op"] == op})
        head = f"{'size':>8} {'count':>11}"
        for impl in impls:
            head += f" | {impl + ' us':>11} {'algbw':>6} {'busbw':>6}"
        for peer in peers:
            head += f" | {'x' + peer:>7}"
        out.append(f"# {op}  (np={np_}; times in µs, bandwidths in GB/s; ! = wrong result)")
        out.append(head)
        for s in sizes:
            first = next((by[(i, op, s)] for i in impls if (i, op, s) in by), {})
            line = f"{human(s):>8} {first.get('count', 0):>11}"
            for impl in impls:
                t, a, b = _cell(by.get((impl, op, s)))
                line += f" | {t:>11} {a:>6} {b:>6}"
            u = by.get(("unison", op, s))
            for peer in peers:
                q = by.get((peer, op, s))
                ok = u and q and "time_us" in u and "time_us" in q and u["time_us"] > 0
                ratio = f"{q['time_us'] / u['time_us']:.2f}" if ok and u and q else "-"
                line += f" | {ratio:>7}"
            out.append(line)
        out.append("")
    return "\n".join(out)


def write_json(path: str, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": list(rows)}, f, indent=1)


def plot(path: str, rows: Sequence[dict[str, Any]], impls: Sequence[str], np_: int) -> None:
    """Bus bandwidth and latency against size, one line per implementation, per operation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows if r["op"] != "barrier"))  # no payload
    if not ops:
        return
    fig, axes = plt.subplots(len(ops), 2, figsize=(11, 3.2 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        bw_ax, lat_ax = axes[i]
        for impl in impls:
            pts = sorted(
                (r["size"], r["busbw"], r["time_us"])
                for r in rows
                if r["op"] == op and r["impl"] == impl and "busbw" in r
            )
            if not pts:
                continue
            xs = [x for x, _, _ in pts]
            bw_ax.plot(xs, [b for _, b, _ in pts], marker="o", ms=3, label=impl)
            lat_ax.plot(xs, [t for _, _, t in pts], marker="o", ms=3, label=impl)
        for ax, what in ((bw_ax, "bus bandwidth (GB/s)"), (lat_ax, "time (µs)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel(what)
            ax.set_title(f"{op}, np={np_}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
