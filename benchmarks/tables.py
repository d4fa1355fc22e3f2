"""Markdown tables from `unison bench --json` files.

    python tables.py FILE...              one full table per file (docs/bench.md)
    python tables.py --pair RUN1 RUN2     ratio tables of two runs side by side
    python tables.py --headline RUN...    README's table: time per call, mean over the runs

× columns are unison's speed over the peer's (the peer's time over unison's)."""

import json
import sys

ORDER = [
    "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier",
    "all_gather_list", "reduce_scatter_list",
]  # fmt: skip


def size_label(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def load(path: str) -> tuple[dict, dict]:
    with open(path) as fh:
        d = json.load(fh)
    return d["meta"], {(r["impl"], r["op"], r["size"]): r for r in d["rows"] if "time_us" in r}


def ratio(rows: dict, peer: str, op: str, size: int) -> str:
    u, p = rows.get(("unison", op, size)), rows.get((peer, op, size))
    if not u or not p:
        return "–"
    x = p["time_us"] / u["time_us"]
    return f"{x:.2f}" if x < 1 else f"{x:.1f}"


def pair(a: str, b: str) -> None:
    (ma, ra), (_, rb) = load(a), load(b)
    sizes = sorted({s for (i, _, s) in ra if i == "unison"} | {s for (i, _, s) in rb})
    ops = [o for o in ORDER if any(k[1] == o for k in ra)]
    for peer, name in (("mpi", "OpenMPI"), ("gloo", "Gloo")):
        print(
            f"| np={ma['np']}, × {name} (run 1 / run 2) | "
            + " | ".join(size_label(s) for s in sizes)
            + " |"
        )
        print("|---|" + "---|" * len(sizes))
        for op in ops:
            cells = []
            for s in sizes:
                x, y = ratio(ra, peer, op, s), ratio(rb, peer, op, s)
                cells.append("– / –" if x == y == "–" else f"{x} / {y}")
            print(f"| {op} | " + " | ".join(cells) + " |")
        print()


def time_label(us: float) -> str:
    if us >= 10_000:
        return f"{us / 1000:.0f} ms"
    if us >= 1000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"


def headline(paths: list[str]) -> None:
    """One table: each operation at 8 B, 1 MiB and 256 MiB, unison / OpenMPI / Gloo time
    per call (the mean of the runs' medians) and unison's speed-up over each peer."""
    runs = [load(p) for p in paths]
    sizes = (8, 1 << 20, 256 << 20)
    print(f"| np={runs[0][0]['np']}, float32 | unison | OpenMPI | Gloo | × OpenMPI | × Gloo |")
    print("|---|---|---|---|---|---|")
    for op in ORDER[:4]:
        for s in sizes:
            t = {}
            for impl in ("unison", "mpi", "gloo"):
                got = [rows[(impl, op, s)]["time_us"] for _, rows in runs if (impl, op, s) in rows]
                t[impl] = sum(got) / len(got) if got else None
            if t["unison"] is None:
                continue
            cells = [time_label(v) if v else "–" for v in t.values()]
            x = [f"{t[p] / t['unison']:.1f}" if t[p] else "–" for p in ("mpi", "gloo")]
            print(f"| {op} {size_label(s)} | " + " | ".join(cells + x) + " |")


if sys.argv[1:2] == ["--headline"]:
    headline(sys.argv[2:])
    sys.exit(0)

if sys.argv[1:2] == ["--pair"]:
    pair(sys.argv[2], sys.argv[3])
    sys.exit(0)

for path in sys.argv[1:]:
    m, rows = load(path)
    lb, la = m["load_before"][0], m["load_after"][0]
    print(
        f"np={m['np']}, {m['dtype']} sum; load before/after {lb:.2f}/{la:.2f}; "
        f"started {m['started']}\n"
    )
    print("| op | size | unison µs | busbw GB/s | Gloo µs | OpenMPI µs | × Gloo | × OpenMPI |")
    print("|---|---|---|---|---|---|---|---|")
    keys = sorted(
        {(o, s) for (i, o, s) in rows if i == "unison"}, key=lambda k: (ORDER.index(k[0]), k[1])
    )
    for op, size in keys:
        u = rows[("unison", op, size)]
        peers = [rows.get((impl, op, size)) for impl in ("gloo", "mpi")]
        t = [f"{r['time_us']:.1f}" if r else "–" for r in peers]
        x = [f"{r['time_us'] / u['time_us']:.2f}" if r else "–" for r in peers]
        print(
            f"| {op} | {size_label(size)} | {u['time_us']:.1f} | {u['busbw']:.2f} | "
            f"{t[0]} | {t[1]} | {x[0]} | {x[1]} |"
        )
    big = rows.get(("unison", "all_reduce", 256 << 20))
    if big:
        extra = (big["peak_rss"] - big["buffer_bytes"]) / (1 << 20)
        print(f"\nPeak RSS after the 256 MiB all_reduce: buffer + {extra:.0f} MiB per rank")
    print()
