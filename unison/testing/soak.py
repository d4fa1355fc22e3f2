"""The soak: many random operations, every result checked, resources tracked.

Every rank draws the same seeded sequence of operations (collective or p2p, size
0–4 MiB on a log scale, dtype, reduce op, root, group, sync or async) and checks
each result against the numpy oracle, rebuilding other ranks' inputs from the
seed. Resident memory, open file descriptors and threads are sampled after a
warm-up and at the end.

    unison run -np 4 python -m unison.testing.soak --ops 20000 --seed 1
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .._types import ReduceOp
from .oracle import reduce_oracle

__all__ = ["SoakReport", "soak"]

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8]
KINDS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "p2p",
]


@dataclass
class SoakReport:
    rank: int
    ops: int
    wrong: int
    seconds: float
    rss_growth_mb: float
    anon_growth_mb: float
    shmem_growth_mb: float
    fd_growth: int
    thread_growth: int
    failures: list[str]
    unexpected_left: int = 0


def _rss_mb(field: str = "VmRSS") -> float:
    """Resident MB from /proc/self/status: VmRSS (all), RssAnon (heap), RssShmem (shm)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _pin_malloc_threshold() -> None:
    """Stop glibc raising its mmap threshold after frees (M_MMAP_THRESHOLD = 128 KiB), so
    freed large buffers go back to the kernel and retained heap does not read as a leak."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
    except (OSError, AttributeError):
        pass


def _unexpected_left() -> int:
    """Messages buffered by the transports that nobody received (a leak if > 0)."""
    from ..backends.native.runtime import Runtime
    from ..world import current

    rt = current()
    if not isinstance(rt, Runtime):
        return 0
    total = 0
    for t in rt.fabric.transports:
        matcher = getattr(t, "matcher", None)
        total += matcher.pending_unexpected() if matcher is not None else 0
    return total


def _data(seed: int, step: int, rank: int, n: int, dtype: Any) -> np.ndarray:
    rng = np.random.default_rng([seed, step, rank])
    return (
        rng.integers(-3, 4, n).astype(dtype)
        if dtype is not np.uint8
        else rng.integers(0, 4, n).astype(dtype)
    )


def soak(ops: int, seed: int = 1, max_bytes: int = 4 << 20) -> SoakReport:
    """Run ``ops`` random operations on the current job; every rank must call it."""
    import unison as un

    _pin_malloc_threshold()
    p, r = un.size(), un.rank()
    groups = [None, un.new_group(list(range(0, p, 2))), un.new_group(list(range(p - 1, -1, -1)))]
    plan = np.random.default_rng(seed)
    pending: list[tuple[Any, Any, str]] = []  # (work, check, description) of operations
    wrong = 0
    failures: list[str] = []
    base: tuple[float, int, int, float, float] | None = None
    start = time.monotonic()

    def settle() -> None:
        nonlocal wrong
        for work, check, what in pending:
            work.wait()
            if not check():
                wrong += 1
                if len(failures) < 10:
                    failures.append(what)
        pending.clear()

    for step in range(ops):
        if step == max(10, ops // 4):  # after warm-up: allocator high-water is reached
            settle()
            base = (
                _rss_mb(),
                _fds(),
                threading.active_count(),
                _rss_mb("RssAnon"),
                _rss_mb("RssShmem"),
            )
        kind = KINDS[plan.integers(len(KINDS))]
        dtype = DTYPES[plan.integers(len(DTYPES))]
        itemsize = np.dtype(dtype).itemsize
        n = int(2 ** plan.uniform(0, np.log2(max_bytes // itemsize))) if plan.random() > 0.05 else 0
        op = [
            ReduceOp.SUM,
            ReduceOp.MAX,
            ReduceOp.MIN,
            ReduceOp.BOR if dtype in (np.int32, np.int64, np.int8, np.uint8) else ReduceOp.PRODUCT,
        ][plan.integers(4)]
        gi = int(plan.integers(len(groups)))
        asyn = bool(plan.random() < 0.3)
        g = groups[gi]
        members = list(range(p)) if g is None else list(g.ranks)
        root = members[int(plan.integers(len(members)))]
        if r not in members and kind != "p2p":  # p2p always runs around the whole world
            continue
        if kind == "p2p":
            members = list(range(p))
        q, me = len(members), members.index(r)
        ins = {k: _data(seed, step, k, n, dtype) for k in members}
        if op is ReduceOp.PRODUCT:
            ins = {k: (v != 0).astype(dtype) + (v > 2).astype(dtype) for k, v in ins.items()}
        check: Any
        if kind == "all_reduce":
            buf = ins[r].copy()
            want = reduce_oracle([ins[k] for k in members], op)
            w = un.all_reduce(buf, op=op, group=g, async_op=True)
            check = lambda buf=buf, want=want: np.array_equal(buf, want)
        elif kind == "broadcast":
            buf = ins[root].copy() if r == root else np.zeros(n, dtype)
            w = un.broadcast(buf, src=root, group=g, async_op=True)
            check = lambda buf=buf, want=ins[root]: np.array_equal(buf, want)
        elif kind == "reduce":
            buf = ins[r].copy()
            want = reduce_oracle([ins[k] for k in members], op) if r == root else ins[r]
            w = un.reduce(buf, dst=root, op=op, group=g, async_op=True)
            check = lambda buf=buf, want=want: np.array_equal(buf, want)
        elif kind == "all_gather":
            m = n // q
            out = np.empty(m * q, dtype)
            w = un.all_gather_into_tensor(out, ins[r][:m], group=g, async_op=True)
            want = np.concatenate([ins[k][:m] for k in members])
            check = lambda out=out, want=want: np.array_equal(out, want)
        elif kind == "reduce_scatter":
            m = n // q
            out = np.empty(m, dtype)
            w = un.reduce_scatter_tensor(out, ins[r][: m * q], op=op, group=g, async_op=True)
            full = reduce_oracle([ins[k][: m * q] for k in members], op)
            check = lambda out=out, want=full[me * m : (me + 1) * m]: np.array_equal(out, want)
        elif kind == "all_to_all":
            m = n // q
            out = np.empty(m * q, dtype)
            w = un.all_to_all_single(out, ins[r][: m * q], group=g, async_op=True)
            want = np.concatenate([ins[k][me * m : (me + 1) * m] for k in members])
            check = lambda out=out, want=want: np.array_equal(out, want)
        elif kind == "gather":
            gl = [np.empty(n, dtype) for _ in members] if r == root else None
            w = un.gather(ins[r], gl, dst=root, group=g, async_op=True)
            check = lambda gl=gl, want=[ins[k] for k in members]: (
                gl is None or all(np.array_equal(a, b) for a, b in zip(gl, want, strict=True))
            )
        elif kind == "scatter":
            got = np.empty(n, dtype)
            sl = [_data(seed, step, 1000 + k, n, dtype) for k in members] if r == root else None
            w = un.scatter(got, sl, src=root, group=g, async_op=True)
            mine = _data(seed, step, 1000 + r, n, dtype)
            check = lambda got=got, want=mine: np.array_equal(got, want)
        elif kind == "barrier":
            w = un.barrier(group=g, async_op=True)
            check = lambda: True
        else:  # p2p around a ring of the whole world
            settle()
            nxt, prv = (r + 1) % p, (r - 1) % p
            box = np.empty(n, dtype)
            if p > 1:
                s = un.isend(_data(seed, step, r, n, dtype), dst=nxt, tag=step % 1000)
                un.irecv(box, src=prv, tag=step % 1000).wait()
                s.wait()
                if not np.array_equal(box, _data(seed, step, prv, n, dtype)):
                    wrong += 1
                    failures.append(f"#{step} p2p {np.dtype(dtype)} n={n}")
            continue
        what = f"#{step} {kind} {op.name} {np.dtype(dtype)} n={n} group={gi} root={root}"
        pending.append((w, check, what))
        if not asyn or len(pending) > 8:
            settle()
    settle()
    un.barrier()
    rss0, fd0, th0, anon0, shm0 = base or (
        _rss_mb(),
        _fds(),
        threading.active_count(),
        _rss_mb("RssAnon"),
        _rss_mb("RssShmem"),
    )
    return SoakReport(
        r,
        ops,
        wrong,
        time.monotonic() - start,
        _rss_mb() - rss0,
        _rss_mb("RssAnon") - anon0,
        _rss_mb("RssShmem") - shm0,
        _fds() - fd0,
        threading.active_count() - th0,
        failures,
        _unexpected_left(),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-bytes", type=int, default=4 << 20)
    args = ap.parse_args()
    import unison as un

    un.init()
    rep = soak(args.ops, args.seed, args.max_bytes)
    reports = un.gather_object(asdict(rep), dst=0)
    if un.rank() == 0 and reports is not None:
        for x in reports:
            print(
                f"soak rank {x['rank']}: {x['ops']} ops, {x['wrong']} wrong, "
                f"{x['seconds']:.1f}s, rss {x['rss_growth_mb']:+.1f} MB "
                f"(heap {x['anon_growth_mb']:+.1f}, shm {x['shmem_growth_mb']:+.1f}), "
                f"fds {x['fd_growth']:+d}, threads {x['thread_growth']:+d}"
            )
        bad = [
            x
            for x in reports
            if x["wrong"]
            or x["anon_growth_mb"] > 20
            or x["fd_growth"] > 0
            or x["thread_growth"] > 0
        ]
        print("soak: FAILED" if bad else "soak: passed")
    un.shutdown()


if __name__ == "__main__":
    main()
