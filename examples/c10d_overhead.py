"""Raw ``dist.all_reduce`` through the c10d backend "unison" vs unison's own API.

    unison run -np 2 python examples/c10d_overhead.py

Times ``torch.distributed.all_reduce`` on a group of backend ``"unison"``,
``unison.all_reduce`` on the same tensors (the native call underneath), and Gloo
for reference, at 8 B, 1 MiB and 64 MiB of float32. The difference between the
first two is what the c10d layer costs per call (Python ProcessGroup dispatch,
Work wrapping). Prints one table on rank 0. A benchmark, not a test: run it on a
quiet machine.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import unison
import unison.torch.distributed  # registers the c10d backend "unison"

SIZES = [("8 B", 8), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def timed(fn: Callable[[], None], iters: int) -> float:
    """Seconds per call: warm up, barrier, then the mean over ``iters`` calls."""
    for _ in range(max(2, iters // 10)):
        fn()
    unison.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=0, help="calls per size (default: by size)")
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
    # the default group reuses the unison runtime this process already joined
    dist.init_process_group(
        "unison", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    gloo = None if args.no_gloo else dist.new_group(backend="gloo")

    rows = []
    for label, nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        iters = args.iters or (2000 if nbytes <= 8 else 200 if nbytes <= 1 << 20 else 10)
        c10d = timed(lambda t=t: dist.all_reduce(t), iters)
        native = timed(lambda t=t: unison.all_reduce(t), iters)
        g = timed(lambda t=t: dist.all_reduce(t, group=gloo), iters) if gloo else float("nan")
        rows.append((label, c10d, native, g))
    if rank == 0:
        print(f"all_reduce float32, np={size}")
        print(f"{'size':>8} {'c10d unison':>14} {'unison API':>14} {'overhead':>10} {'gloo':>12}")
        for label, c, n, g in rows:
            print(
                f"{label:>8} {c * 1e6:12.1f}us {n * 1e6:12.1f}us {(c - n) * 1e6:8.1f}us "
                f"{g * 1e6:10.1f}us"
            )
    dist.destroy_process_group()
    unison.shutdown()


if __name__ == "__main__":
    main()
