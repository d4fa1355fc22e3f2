"""The pure-Python floor of an 8-byte all_reduce over shared memory (issue 11).

No unison code: N processes map one shared segment; each writes its 8-byte payload and
a sequence number into its own cache line, polls until every peer's sequence number has
arrived, then sums the peers' payloads in rank order with numpy. This is the least a
Python process can do per call; unison's lane adds its validation, signature check,
failure checks and deadlines on top.

Two wait modes: ``spin`` (poll only; fair only with a core per rank) and ``yield``
(poll, calling ``os.sched_yield()`` between polls: OpenMPI's yield-when-idle, for more
ranks than cores). Prints, per mode, the median and minimum over blocks of the slowest
rank's mean µs per call.

    python benchmarks/floor.py --np 2 --calls 20000
    python benchmarks/floor.py --np 4 --calls 5000 --modes yield
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing import shared_memory

import numpy as np

LINE = 64  # one cache line per rank: [seq u64][payload 8 B][pad]


def _rank(name: str, rank: int, n: int, calls: int, blocks: int, mode: str, q: mp.Queue) -> None:
    shm = shared_memory.SharedMemory(name=name)
    try:
        buf = np.ndarray((n, LINE // 8), dtype=np.uint64, buffer=shm.buf)
        seqs = buf[:, 0]
        # two payload slots per rank, used by parity: a rank can only reach call s+2
        # after every peer published s+1, i.e. after every peer had read call s
        pays = np.ndarray((n, LINE // 8), dtype=np.float64, buffer=shm.buf)[:, 1:3]
        mine = float(rank + 1)
        out = np.empty((), dtype=np.float64)
        do_yield = mode == "yield"
        seq = 0
        per_block = []
        for _ in range(blocks):
            t0 = time.perf_counter()
            for _ in range(calls // blocks):
                seq += 1
                col = pays[:, seq & 1]
                col[rank] = mine
                seqs[rank] = seq
                for p in range(n):
                    while seqs[p] < seq:
                        if do_yield:
                            os.sched_yield()
                np.sum(col, out=out)
            per_block.append((time.perf_counter() - t0) / (calls // blocks) * 1e6)
        assert out[()] == n * (n + 1) / 2, out
        q.put((rank, per_block))
    finally:
        del buf, seqs, pays, col
        shm.close()


def measure(n: int, calls: int, blocks: int, mode: str) -> tuple[float, float]:
    shm = shared_memory.SharedMemory(create=True, size=n * LINE)
    try:
        np.ndarray((n * LINE,), dtype=np.uint8, buffer=shm.buf)[:] = 0
        q: mp.Queue = mp.Queue()
        procs = [
            mp.Process(target=_rank, args=(shm.name, r, n, calls, blocks, mode, q))
            for r in range(n)
        ]
        for p in procs:
            p.start()
        got = dict(q.get(timeout=300) for _ in procs)
        for p in procs:
            p.join(60)
        slowest = [max(got[r][b] for r in range(n)) for b in range(blocks)]
        return statistics.median(slowest), min(slowest)
    finally:
        shm.close()
        shm.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--modes", default="spin,yield")
    a = ap.parse_args()
    print(f"np={a.np} calls={a.calls} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
    for mode in a.modes.split(","):
        med, lo = measure(a.np, a.calls, a.blocks, mode)
        print(f"{mode:6s} 8-byte all_reduce floor: median {med:.2f} µs, min {lo:.2f} µs per call")


if __name__ == "__main__":
    main()
