"""Raw ``dist.all_reduce`` through the c10d backend "unison" vs unison's own API.

    unison run -np 2 python benchmarks/c10d_overhead.py

Times ``torch.distributed.all_reduce`` on the default group of backend ``"unison"``,
``unison.all_reduce`` on the same tensor (the native call underneath, same group,
same algorithm, same memory: the backend hands unison the tensor's own storage, no
copy) and Gloo for reference, at 8 B, 1 MiB and 64 MiB of float32. The difference
between the first two is what the c10d layer costs per call (torch's Python
wrapper, the ProcessGroup method, the Work handed back).

The three are interleaved: each repetition times a block of calls of each in turn,
so a machine whose load changes during the run slows all three alike. The table
gives the minimum and the median per call over the repetitions, and the overhead as
the median of the per-repetition differences (c10d block minus native block), which
is what cancels shared noise. Prints one table on rank 0. A benchmark, not a test:
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import unison
import unison.torch.distributed  # registers the c10d backend "unison"

SIZES = [("8 B", 8), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def block(fn: Callable[[], None], calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls, started together on every rank."""
    unison.barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="interleaved repetitions per size")
    ap.add_argument("--calls", type=int, default=0, help="calls per block (default: by size)")
    ap.add_argument("--no-gloo", action="store_true")
    args = ap.parse_args()

    unison.init()
    rank, size = unison.rank(), unison.size()
    port = 0
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = unison.broadcast_object(port, 0)
    # the default group reuses the unison runtime this process already joined (its
    # world group: the same group, engine and algorithms as unison.all_reduce)
    dist.init_process_group(
        "unison", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    gloo = None if args.no_gloo else dist.new_group(backend="gloo")

    # one single-rank group per rank, in both APIs: the same call with no peer to wait
    # for, so its difference is the c10d layer's own cost, free of the other rank's noise
    alone_c10d, alone_native = None, None
    for r in range(size):
        tg, ug = dist.new_group([r], backend="unison"), unison.new_group([r])
        if r == rank:
            alone_c10d, alone_native = tg, ug

    rows = []
    x = torch.ones(2)
    alone = {
        "c10d": lambda: dist.all_reduce(x, group=alone_c10d),
        "native": lambda: unison.all_reduce(x, group=alone_native),
    }
    for fn in alone.values():
        block(fn, 100)
    atimes: dict[str, list[float]] = {k: [] for k in alone}
    for _ in range(args.reps):
        for name, fn in alone.items():
            atimes[name].append(block(fn, 500))
    adiff = [c - n for c, n in zip(atimes["c10d"], atimes["native"], strict=True)]
    rows.append(("8 B*", atimes, statistics.median(adiff)))
    for label, nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        calls = args.calls or (200 if nbytes <= 8 else 20 if nbytes <= 1 << 20 else 2)
        impls: dict[str, Callable[[], None]] = {
            "c10d": lambda t=t: dist.all_reduce(t),
            "native": lambda t=t: unison.all_reduce(t),
        }
        if gloo is not None:
            impls["gloo"] = lambda t=t: dist.all_reduce(t, group=gloo)
        for fn in impls.values():  # warm-up: first touches, algorithm set-up
            block(fn, 2)
        times: dict[str, list[float]] = {k: [] for k in impls}
        for _ in range(args.reps):
            for name, fn in impls.items():
                times[name].append(block(fn, calls))
        diff = [c - n for c, n in zip(times["c10d"], times["native"], strict=True)]
        rows.append((label, times, statistics.median(diff)))
    if rank == 0:
        print(f"all_reduce float32, np={size}, {args.reps} interleaved repetitions (min / median)")
        print(
            f"{'size':>7} {'c10d unison':>21} {'unison API':>21} {'c10d overhead':>14} "
            f"{'gloo':>21} {'c10d/gloo':>9}"
        )

        def mm(v: list[float]) -> str:
            return f"{min(v) * 1e6:9.1f} /{statistics.median(v) * 1e6:9.1f}"

        for label, times, over in rows:
            g = times.get("gloo")
            ratio = f"{statistics.median(times['c10d']) / statistics.median(g):8.2f}x" if g else ""
            print(
                f"{label:>7} {mm(times['c10d'])}us {mm(times['native'])}us {over * 1e6:12.1f}us "
                f"{mm(g) + 'us' if g else '':>23} {ratio}"
            )
        print(
            "8 B*: a group of this rank alone (no peer to wait for): the layer's own cost\n"
            "target: c10d overhead < 20 us per call at every size (issue 13, section 4)"
        )
    dist.destroy_process_group()
    unison.shutdown()


if __name__ == "__main__":
    main()
