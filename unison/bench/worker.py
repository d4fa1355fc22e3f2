"""What every benchmark rank runs: ``python -m unison.bench.worker IMPL SPEC OUT``.

Per (operation, size): allocate the buffers, check the result on known inputs
(``spec.check`` times), warm up, barrier, time ``iters`` runs one by one; then rank 0 gathers
every rank's per-iteration times, takes the slowest rank of each iteration and
the median over iterations, and appends the row (a JSON line) to OUT as soon as it
is measured, so ``unison bench`` can print it while the sweep goes on. It also
records the rank's peak resident memory during the row (``VmHWM`` after
resetting it through ``/proc/self/clear_refs``), and what the timed calls cost the
processes besides wall time (``getrusage``: CPU seconds, voluntary and involuntary
context switches per call, averaged over the ranks): when ranks outnumber cores, or
the machine is shared, these counts say where the time went when the clock cannot.
"""

from __future__ import annotations

import gc
import json
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .backends import Case, make_backend
from .spec import BenchSpec, base_op, bus_factor

__all__ = ["main", "peak_rss", "reset_peak_rss"]


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """Peak resident set size of this process in bytes (0 where unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _progress(total: int, name: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=f"{name:>6}", unit="row", file=sys.stderr, leave=False)


def sweep(
    impl: str,
    spec: BenchSpec,
    port: int,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every (operation, size) of ``spec``; rank 0 returns the rows (others: [])
    and hands each finished row to ``on_row`` as soon as it is measured."""
    be = make_backend(impl, port)
    done = on_row if on_row is not None and be.rank == 0 else (lambda row: None)
    dtype = np.dtype(spec.dtype)
    p = be.size
    rows: list[dict[str, Any]] = []
    bar = _progress(len(spec.ops) * len(spec.sizes), impl, be.rank == 0 and sys.stderr.isatty())
    np.seterr(all="ignore")
    try:
        for op in spec.ops:
            for size in spec.sizes[:1] if op == "barrier" else spec.sizes:
                row: dict[str, Any] = {"impl": impl, "op": op, "size": size, "np": p}
                rows.append(row)
                if bar is not None:
                    bar.set_postfix_str(f"{op} {size}B")
                    bar.update(1)
                count = size // dtype.itemsize
                parts = p if base_op(op) in ("all_gather", "reduce_scatter", "all_to_all") else 1
                if (count < parts or count == 0) and op != "barrier":
                    row["skipped"] = "size below one element per rank"
                    done(row)
                    continue
                gc.collect()
                case = Case(op, count, dtype, be.rank, p)
                why = be.bind(case)
                if why is not None:
                    row["skipped"] = why
                    done(row)
                    continue
                row.update(size=case.nbytes, count=case.count)
                try:
                    err = None
                    for _ in range(spec.check):
                        err = err or case.check()
                except Exception as exc:  # a peer's unsupported operation
                    row["skipped"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    done(row)
                    continue
                gc.collect()
                reset_peak_rss()  # the peak of the timed runs, not of the check's temporaries
                for _ in range(spec.warmup if case.nbytes < 64 << 20 else 1):
                    case.run()
                be.barrier()
                times = []
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                for _ in range(spec.iters_for(case.nbytes)):
                    t0 = time.perf_counter()
                    case.run()
                    times.append(time.perf_counter() - t0)
                use = _usage(ru0, resource.getrusage(resource.RUSAGE_SELF), len(times))
                got = be.gather([err, times, peak_rss(), use, socket.gethostname()])
                if got is None:
                    continue
                errs = [f"rank {r}: {e}" for r, (e, *_) in enumerate(got) if e]
                slowest = [max(g[1][i] for g in got) for i in range(len(times))]
                med = statistics.median(slowest)
                algbw = case.nbytes / med / 1e9 if med > 0 else 0.0
                row.update(
                    time_us=med * 1e6,
                    algbw=algbw,
                    busbw=algbw * bus_factor(op, p),
                    iters=len(times),
                    peak_rss=max(g[2] for g in got),
                    # per call, mean over ranks: CPU µs, voluntary / involuntary switches
                    cpu_us=sum(g[3][0] for g in got) / len(got) * 1e6,
                    vcsw=sum(g[3][1] for g in got) / len(got),
                    ivcsw=sum(g[3][2] for g in got) / len(got),
                    buffer_bytes=sum(int(b.nbytes) for b in case.bufs.values()),
                    # how many distinct host names the ranks ran under (where placement
                    # is in doubt: did every host get its ranks?)
                    hostnames=len({g[4] for g in got}),
                    correct=not errs,
                )
                if errs:
                    row["error"] = "; ".join(errs)[:500]
                if not spec.check:
                    row["correct"] = None  # not checked
                done(row)
                del case
    finally:
        if bar is not None:
            bar.close()
        be.close()
    return rows if be.rank == 0 else []


def _usage(a: resource.struct_rusage, b: resource.struct_rusage, calls: int) -> list[float]:
    """Per call between two ``getrusage`` samples: CPU seconds (user + system),
    voluntary and involuntary context switches."""
    k = max(calls, 1)
    cpu = (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)
    return [cpu / k, (b.ru_nvcsw - a.ru_nvcsw) / k, (b.ru_nivcsw - a.ru_nivcsw) / k]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    impl, spec_json, out, port = argv[0], argv[1], argv[2], int(argv[3])

    def append(row: dict[str, Any]) -> None:
        with open(out, "a") as f:  # one whole line per write: the reader never sees half
            f.write(json.dumps(row) + "\n")

    sweep(impl, BenchSpec.from_json(spec_json), port, append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
