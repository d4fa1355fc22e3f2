"""Set-up and teardown: ``unison.init`` + ``new_group`` + ``shutdown``, and torch's
``init_process_group`` + ``new_group`` + ``destroy_process_group`` over "unison" and Gloo.

    unison run -np 2 python benchmarks/setup_times.py [--reps 15] [--no-c10d]

Each repetition runs the three set-ups in turn, so a machine whose load changes slows
all three alike: unison's own API through the launcher's rendezvous store first (it
agrees, outside its timed parts, the ports of the repetition's ``tcp://`` stores), then
torch.distributed with the backends ``"unison"`` and ``"gloo"``, in an order that
alternates between repetitions, each over a fresh ``TCPStore`` on rank 0 that every
rank connected to before the timed part, which the ranks start together. Every part is
timed on every rank; a repetition's figure is the slowest rank's. unison's own ``init``
is timed from the moment the last rank entered it (the ranks do not start it together).
Prints, on rank 0, the median and minimum of each part over the repetitions after the
first (the first pays first-use work; it is shown apart), and the process's very first
``unison.init`` (imports, reading the host's link model: set ``UNISON_LINK_CACHE`` to an
empty directory to time a host never calibrated). A benchmark, not a test: run it on a
quiet machine.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable

import unison

Parts = dict[str, float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def native(ports: list[int], starts: list[float]) -> Parts:
    """unison.init, a new group of every rank, unison.shutdown; agrees the next ports.
    Appends when this rank entered ``init`` to ``starts`` (the host's monotonic clock)."""
    t0 = time.perf_counter()
    starts.append(t0)
    unison.init()
    t1 = time.perf_counter()
    unison.new_group(list(range(unison.size())))
    t2 = time.perf_counter()
    # outside the timed parts: rank 0's free ports for the c10d stores of this repetition
    got = unison.broadcast_object([_free_port(), _free_port()] if unison.rank() == 0 else None)
    ports[:] = got
    t3 = time.perf_counter()
    unison.shutdown()
    t4 = time.perf_counter()
    return {"init": t1 - t0, "new_group": t2 - t1, "destroy": t4 - t3}


def c10d(backend: str, port: int, rank: int, size: int) -> Parts:
    """torch's init_process_group over a store every rank has connected to (untimed), a
    new group of every rank, destroy_process_group."""
    from datetime import timedelta

    import torch.distributed as dist

    import unison.torch.distributed  # noqa: F401  (registers the backend "unison")

    # The store is torch's, the same for every backend, and made outside the timed part:
    # a client that reaches it before rank 0 listens backs off for hundreds of
    # milliseconds (torch's jittered retry), and rank 0 returns from making it only once
    # every client has connected; either would time torch's rendezvous and the ranks'
    # arrival order, not the backend. So the ranks also start the timed part together:
    # the last to arrive releases the others (torch's store answers waiters at once).
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timedelta(seconds=60))
    if store.add("bench/arrived", 1) == size:
        store.set("bench/go", b"1")
    store.wait(["bench/go"])
    t0 = time.perf_counter()
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    t1 = time.perf_counter()
    dist.new_group(list(range(size)), backend=backend)
    t2 = time.perf_counter()
    dist.destroy_process_group()
    t3 = time.perf_counter()
    del store
    return {"init": t1 - t0, "new_group": t2 - t1, "destroy": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="repetitions (the first is shown apart)")
    ap.add_argument("--no-c10d", action="store_true", help="unison's own API only")
    args = ap.parse_args()

    t = time.perf_counter()
    unison.init()  # rank and size, and a first port pair, from the launcher's job
    first_init = time.perf_counter() - t  # the process's first: imports, the link model
    rank, size = unison.rank(), unison.size()
    ports = unison.broadcast_object([_free_port(), _free_port()] if rank == 0 else None)
    unison.shutdown()

    starts: list[float] = []  # when this rank entered each repetition's unison.init
    kinds: dict[str, Callable[[], Parts]] = {"unison": lambda: native(ports, starts)}
    if not args.no_c10d:
        kinds["c10d unison"] = lambda: c10d("unison", ports[0], rank, size)
        kinds["c10d gloo"] = lambda: c10d("gloo", ports[1], rank, size)
    names = list(kinds)
    rows: dict[str, list[Parts]] = {k: [] for k in names}
    for rep in range(args.reps):
        torch_kinds = names[1:] if rep % 2 == 0 else names[1:][::-1]
        for k in ["unison", *torch_kinds]:
            rows[k].append(kinds[k]())

    # every rank's figures to rank 0 (one more set-up, untimed)
    unison.init()
    every = unison.gather_object((first_init, rows, starts), 0)
    unison.shutdown()
    if rank != 0 or every is None:
        return
    firsts = [f for f, _, _ in every]
    # unison.init cannot end before the last rank has entered it, and the ranks enter it
    # as each finishes the previous repetition: its time counts from the last rank's
    # entry (one host: time.perf_counter() is the same clock in every process), as the
    # torch set-ups start together
    for i in range(args.reps):
        last = max(st[i] for _, _, st in every)
        for _, r, st in every:
            r["unison"][i]["init"] -= last - st[i]
    every = [r for _, r, _ in every]
    print(f"np={size}, {args.reps} repetitions; ms, slowest rank per repetition")
    print(f"the process's first unison.init: {max(firsts) * 1e3:.1f} ms")
    print("| set-up | part | first | median | min |\n|---|---|---|---|---|")
    for k in names:
        for part in ("init", "new_group", "destroy", "total"):
            per_rep = []
            for i in range(args.reps):
                vals = [r[k][i] for r in every]
                per_rep.append(
                    max(sum(v.values()) if part == "total" else v[part] for v in vals) * 1e3
                )
            rest = per_rep[1:] or per_rep
            print(
                f"| {k} | {part} | {per_rep[0]:.1f} | {statistics.median(rest):.1f} "
                f"| {min(rest):.1f} |"
            )


if __name__ == "__main__":
    main()
