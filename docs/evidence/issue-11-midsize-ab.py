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
    ap.add_argument("--new-algo", default="", help="UNISON_ALGO syntax for 'new' alone")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per variant")
    ap.add_argument("--iters", type=int, default=0, help="calls per block (0: by size)")
    ap.add_argument("--count", action="store_true", help="count bytes, syncs, calls")
    ap.add_argument("--phases", action="store_true", help="time copies, syncs, reductions")
    args = ap.parse_args()
    os.environ["UNISON_ALGO"] = args.algo
    import unison as un
    from unison import algorithms

    old = load_old(args.old)
    new = {name: getattr(algorithms, name).run for name in MODS}
    import importlib

    mods = {name: importlib.import_module(f"unison.algorithms.{name}") for name in MODS}

    from unison.config import load_config
    from unison.world import current

    forced = {
        "old": load_config({"UNISON_ALGO": args.algo}).algo_overrides(),
        "new": load_config({"UNISON_ALGO": args.new_algo or args.algo}).algo_overrides(),
    }

    def use(variant: str) -> None:
        for name, mod in mods.items():
            mod.run = old[name].run if variant == "old" else new[name]  # type: ignore[attr-defined]
        current().overrides = forced[variant]

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

    if args.count or args.phases:
        count(un, [*mods.values(), *old.values()], use, ops, sizes, make, me, args.phases)
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
    un: Any,
    mods: list[ModuleType],
    use: Any,
    ops: list[str],
    sizes: list[int],
    make: Any,
    me: int,
    phases: bool = False,
) -> None:
    """Bytes through copy_into and the reduction kernel, syncs, Python calls: one call.
    ``phases``: instead, wall µs per call spent in copies, reductions and syncs (the
    sync's time is mostly waiting for the slower rank), mean of 30 calls, rank 0."""
    from unison.algorithms import shm_arena
    from unison.backends.native import backend
    from unison.buffers import copy_into as real_copy

    tally = {"copy": 0, "reduce_read": 0, "reduce_write": 0, "syncs": 0}
    spent = {"copy": 0.0, "reduce": 0.0, "sync": 0.0}
    real_kernel = backend.kernel
    clock = time.perf_counter

    def counting_copy(dst: np.ndarray, src: np.ndarray) -> None:
        tally["copy"] += dst.nbytes
        t = clock()
        real_copy(dst, src)
        spent["copy"] += clock() - t

    def counting_kernel(op: Any, dt: Any) -> Any:
        k = real_kernel(op, dt)

        def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            tally["reduce_read"] += a.nbytes + b.nbytes
            tally["reduce_write"] += out.nbytes
            t = clock()
            k(a, b, out)
            spent["reduce"] += clock() - t

        return run

    def counting_sync(ctx: Any, step: int) -> None:
        tally["syncs"] += 1
        t = clock()
        shm_arena.sync(ctx, step)
        spent["sync"] += clock() - t

    def patch(on: bool) -> None:
        for mod in mods:
            if hasattr(mod, "copy_into"):
                mod.copy_into = counting_copy if on else real_copy  # type: ignore[attr-defined]
            mod.sync = counting_sync if on else shm_arena.sync  # type: ignore[attr-defined]
        backend.kernel = counting_kernel if on else real_kernel  # type: ignore[assignment]

    if me == 0 and not phases:
        print("rank 0, one call: bytes copied (read = written), bytes the reduction reads/writes,")
        print("syncs (round barriers), Python calls (cProfile, calling thread)")
    if me == 0 and phases:
        print("rank 0, wall us per call (mean of 30): whole call, copies, reductions, syncs, rest")
    for op in ops:
        for nbytes in sizes:
            for v in ("old", "new"):
                use(v)
                patch(True)
                fn = make(op, nbytes)
                fn()  # warm (and the first call's one-time work)
                for k in tally:
                    tally[k] = 0
                for k in spent:
                    spent[k] = 0.0
                un.barrier()
                if phases:
                    reps = 30
                    t0 = clock()
                    for _ in range(reps):
                        fn()
                    whole = (clock() - t0) / reps * 1e6
                    patch(False)
                    un.barrier()
                    if me == 0:
                        c, r, y = (spent[k] / reps * 1e6 for k in ("copy", "reduce", "sync"))
                        print(
                            f"{op:15s} {nbytes:>10d} {v:4s} call {whole:9.1f}  copy {c:8.1f}  "
                            f"reduce {r:8.1f}  sync {y:8.1f}  rest {whole - c - r - y:8.1f}",
                            flush=True,
                        )
                    continue
                prof = cProfile.Profile()
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
