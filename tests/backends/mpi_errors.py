"""Typed errors on the mpi backend (run under mpirun by test_backends.py)."""

from __future__ import annotations

import sys

import numpy as np

import unison as un

if __name__ == "__main__":
    un.init(backend="mpi", timeout=2)
    r = un.rank()
    try:
        if r == 0:
            un.send(np.arange(16, dtype=np.int64), 1, tag=5)
        else:
            try:
                un.recv(np.empty(4, np.int64), 0, tag=5)
            except un.MismatchError as exc:
                print(f"rank 1 MismatchError: {exc}", flush=True)
        try:  # ranks disagree on the count: refused on both before MPI sees it
            un.all_reduce(np.ones(4 + 4 * r))
        except un.MismatchError as exc:
            print(f"rank {r} MismatchError: {exc}", flush=True)
        a = np.array([r + 1.0])
        un.all_reduce(a)
        print(f"rank {r} usable after mismatch: {a[0]}", flush=True)
        if r == 0:  # rank 1 never joins this one
            g = un.new_group([0, 1])
            try:
                un.all_reduce(np.ones(4), group=g)
            except un.CollectiveTimeoutError as exc:
                print(f"rank 0 CollectiveTimeoutError: {exc}", flush=True)
            try:  # the group's state is now unknown: refused, not run
                un.all_reduce(np.ones(4), group=g)
            except un.AbortedError as exc:
                print(f"rank 0 AbortedError: {exc}", flush=True)
        else:
            un.new_group([0, 1])
        try:
            un.all_reduce(np.ones(4, np.float32), un.ReduceOp.BXOR)
        except un.InvalidArgumentError:
            print(f"rank {r} InvalidArgumentError", flush=True)
    finally:
        sys.stdout.flush()
    # the timed-out collective is still posted on rank 0: leave without MPI_Finalize's
    # wait, rank 1 last so that mpirun does not end rank 0 before it reports
    import os
    import time

    if r == 1:
        time.sleep(4)
    os._exit(0)
