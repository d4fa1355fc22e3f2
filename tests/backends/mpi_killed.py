"""A rank killed mid-job on the mpi backend (run under mpirun by test_engine_errors.py).

Each survivor prints what it got (or that it got nothing) before it leaves; what
OpenMPI itself does with the job is the test's to check."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import unison as un

if __name__ == "__main__":
    un.init(backend="mpi", timeout=float(os.environ.get("KILL_TIMEOUT", "5")))
    r = un.rank()
    print(f"rank {r} pid {os.getpid()}", flush=True)
    x = np.ones(1 << 14, np.float32)
    t0 = time.monotonic()
    try:
        for step in range(200):
            if step == 10 and r == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            un.all_reduce(x)
            t0 = time.monotonic()
    except un.CommunicationError as exc:
        took = time.monotonic() - t0
        print(f"rank {r} {type(exc).__name__} after {took:.1f}s: {exc}", flush=True)
        os._exit(3)
    print(f"rank {r} no error", flush=True)
    os._exit(0)
