"""Interleaved A/B of the direct shared-memory algorithms' data path (issue 11, mid sizes).

"old" is the ``run`` of each direct algorithm as of a git revision (default: 960eecc, the
base of this round), loaded from ``git show``; "new" is the working tree's. Both run in
one job, alternating in blocks, with the same forced algorithm choice, so load drifts
hit both alike. Per (op, size, variant): min and median over iterations of the slowest
rank's time, and the mean CPU time per call (user+sys, mean over ranks).

``--count`` instead counts, for one call of each variant on each rank: bytes read and
written by the copies and reductions (the memory passes), synchronisation rounds, and
Python function calls (cProfile, the calling thread).

Run from the repository root (it needs ``git``)::

    PYTHONPATH=$PWD python -m unison run -np 2 python docs/evidence/issue-11-midsize-ab.py
    PYTHONPATH=$PWD python -m unison run -np 2 python docs/evidence/issue-11-midsize-ab.py --count
    ... --ops all_reduce --sizes 268435456 --blocks 4 --iters 3
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np

MODS = (
    "all_reduce_shm",
    "all_reduce_shm_one",
    "broadcast_shm",
    "all_gather_shm",
    "reduce_scatter_shm",
)
ALGO = "all_reduce:shm_one,broadcast:shm,all_gather:shm,reduce_scatter:shm"


def load_old(ref: str) -> dict[str, ModuleType]:
    old = {}
    for name in MODS:
        src = subprocess.run(
            ["git", "show", f"{ref}:unison/algorithms/{name}.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        spec = importlib.util.spec_from_loader(f"unison.algorithms._ab_old_{name}", loader=None)
        assert spec is not None
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = "unison.algorithms"
        exec(compile(src, f"{ref}:{name}.py", "exec"), mod.__dict__)
        old[name] = mod
    return old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="960eecc")
    ap.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter")
    ap.add_argument("--sizes", default="1048576,16777216")
    ap.add_argument("--algo", default=ALGO, help="UNISON_ALGO for both variants")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per variant")
    ap.add_argument("--iters", type=int, default=0, help="calls per block (0: by size)")
    ap.add_argument("--count", action="store_true", help="count bytes, syncs, calls")
    args = ap.parse_args()
    os.environ["UNISON_ALGO"] = args.algo
    import unison as un
    from unison import algorithms

    old = load_old(args.old)
    new = {name: getattr(algorithms, name).run for name in MODS}
    import importlib

    mods = {name: importlib.import_module(f"unison.algorithms.{name}") for name in MODS}

    def use(variant: str) -> None:
        for name, mod in mods.items():
            mod.run = old[name].run if variant == "old" else new[name]  # type: ignore[attr-defined]

    un.init()
    me, p = un.rank(), un.size()
    ops = args.ops.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]

    def make(op: str, nbytes: int) -> Any:
        n = nbytes // 4
        rng = np.random.default_rng(me)
        a = rng.standard_normal(n).astype(np.float32)
        if op == "all_reduce":
            return lambda: un.all_reduce(a)
        if op == "broadcast":
            return lambda: un.broadcast(a, 0)
        if op == "all_gather":
            outs = [np.empty(n // p, np.float32) for _ in range(p)]
            return lambda: un.all_gather(outs, a[: n // p])
        if op == "reduce_scatter":
            out = np.empty(n // p, np.float32)
            ins = [a[i * (n // p) : (i + 1) * (n // p)] for i in range(p)]
            return lambda: un.reduce_scatter(out, ins)
        raise SystemExit(f"unknown op {op}")

    if args.count:
        count(un, [*mods.values(), *old.values()], use, ops, sizes, make, me)
        un.shutdown()
        return

    if me == 0:
        print(f"np={p} load={os.getloadavg()[0]:.2f} old={args.old} algo={args.algo}")
        print(
            f"{'op':15s} {'size':>10s} {'variant':7s} "
            f"{'min us':>10s} {'med us':>10s} {'cpu us':>9s}"
        )
    for op in ops:
        for nbytes in sizes:
            fn = make(op, nbytes)
            iters = args.iters or max(3, min(50, (64 << 20) // nbytes))
            times: dict[str, list[float]] = {"old": [], "new": []}
            cpu: dict[str, list[float]] = {"old": [], "new": []}
            for v in ("old", "new"):  # warm both
                use(v)
                fn()
            for b in range(2 * args.blocks):
                v = ("old", "new")[b % 2] if (b // 2) % 2 == 0 else ("new", "old")[b % 2]
                use(v)
                un.barrier()
                t = np.empty(iters)
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                for i in range(iters):
                    t0 = time.perf_counter()
                    fn()
                    t[i] = time.perf_counter() - t0
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                un.all_reduce(t, op=un.ReduceOp.MAX)  # the slowest rank, per iteration
                c = np.array([(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / iters])
                un.all_reduce(c)
                times[v].extend(t.tolist())
                cpu[v].append(float(c[0]) / p)
            if me == 0:
                for v in ("old", "new"):
                    print(
                        f"{op:15s} {nbytes:>10d} {v:7s} {min(times[v]) * 1e6:10.1f} "
                        f"{statistics.median(times[v]) * 1e6:10.1f} "
                        f"{statistics.mean(cpu[v]) * 1e6:9.1f}",
                        flush=True,
                    )
    un.shutdown()


def count(
    un: Any, mods: list[ModuleType], use: Any, ops: list[str], sizes: list[int], make: Any, me: int
) -> None:
    """Bytes through copy_into and the reduction kernel, syncs, Python calls: one call."""
    from unison.algorithms import shm_arena
    from unison.backends.native import backend

    tally = {"copy": 0, "reduce_read": 0, "reduce_write": 0, "syncs": 0}
    from unison.buffers import copy_into as real_reduce_copy

    real_kernel = backend.kernel

    def counting_copy(dst: np.ndarray, src: np.ndarray) -> None:
        tally["copy"] += dst.nbytes
        real_reduce_copy(dst, src)

    def counting_kernel(op: Any, dt: Any) -> Any:
        k = real_kernel(op, dt)

        def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            tally["reduce_read"] += a.nbytes + b.nbytes
            tally["reduce_write"] += out.nbytes
            k(a, b, out)

        return run

    def counting_sync(ctx: Any, step: int) -> None:
        tally["syncs"] += 1
        shm_arena.sync(ctx, step)

    def patch(on: bool) -> None:
        for mod in mods:
            if hasattr(mod, "copy_into"):
                mod.copy_into = counting_copy if on else real_reduce_copy  # type: ignore[attr-defined]
            mod.sync = counting_sync if on else shm_arena.sync  # type: ignore[attr-defined]
        backend.kernel = counting_kernel if on else real_kernel  # type: ignore[assignment]

    if me == 0:
        print(
            "per rank 0, one call: bytes copied (read = written), bytes the reduction reads / writes,"
        )
        print("syncs (round barriers), Python calls (cProfile, calling thread)")
    for op in ops:
        for nbytes in sizes:
            for v in ("old", "new"):
                use(v)
                patch(True)
                fn = make(op, nbytes)
                fn()  # warm (and the first call's one-time work)
                for k in tally:
                    tally[k] = 0
                prof = cProfile.Profile()
                un.barrier()
                prof.enable()
                fn()
                prof.disable()
                patch(False)
                un.barrier()
                calls = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]
                if me == 0:
                    mb = 1 << 20
                    print(
                        f"{op:15s} {nbytes:>10d} {v:4s} copy {tally['copy'] / mb:7.2f} MiB  "
                        f"reduce r/w {tally['reduce_read'] / mb:6.2f}/"
                        f"{tally['reduce_write'] / mb:6.2f} MiB  "
                        f"syncs {tally['syncs']:4d}  calls {calls}",
                        flush=True,
                    )


if __name__ == "__main__":
    sys.exit(main())
