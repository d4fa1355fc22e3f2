"""An elastic parameter-server worker for tests/ps/test_ps_elastic_jobs.py.

``python -m tests.ps._elastic_train MODE FLAGDIR STEPS``: MODE ``bsp`` or ``ssp``
(``SSP(2)``). Worker 1 of the first world pushes at clock 3 and kills itself (SIGKILL)
before finishing that step; the others stop before their pull at clock 5 until its
replacement has joined and pulled (a file in FLAGDIR, no timing), so the servers' state
at that moment is known exactly. Every pull is printed; workers push ``id + 1``.
MODE ``killserver``: BSP, and worker 0 SIGKILLs the last rank (a server) at clock 2.
MODE ``host``: BSP, nobody kills itself; worker 0 prints ``READY`` at clock 3 (the test
then kills a whole host) and the first workers wait at clock 5 for ``PS_TEST_JOINS``
replacements.
MODE ``grow``: BSP, nobody is lost; worker 0 creates FLAGDIR/grow at clock 2 (the
discovery script then lists one more slot) and the first workers wait at clock 5 for
the new worker.
MODE ``dropserver``: BSP, nobody is lost; worker 0 creates FLAGDIR/drop at clock 2 (the
discovery script then stops listing the server's host); nobody joins, so the workers
wait at clock 5 until the launcher ends the job.
With ``PS_TEST_CRASH_JOIN=1`` the first replacement exits (status 5) before ``ps.init``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import unison.ps as ps
from unison.world import current

KILL_AT, WAIT_AT = 3, 5


def main() -> None:
    mode, flagdir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if os.environ.get("UNISON_PS_JOIN") and os.environ.get("PS_TEST_CRASH_JOIN"):
        marker = os.path.join(flagdir, "crashed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(5)
    split = int(os.environ.get("PS_TEST_SPLIT_BYTES", str(1 << 20)))  # 16: over 2 servers
    kv = ps.init(consistency=ps.SSP(2) if mode == "ssp" else ps.BSP(), split_bytes=split)
    kv.init_params({"w": np.zeros(8)})
    kv.set_optimizer(ps.Sum())
    me, joined = kv.rank, kv.joined_at is not None
    joins = int(os.environ.get("PS_TEST_JOINS", "1"))
    if joined:
        first = kv.pull("w")["w"]
        print(f"JOINED {me} {kv.joined_at} {kv.num_workers} {first.tolist()}", flush=True)
        open(os.path.join(flagdir, f"joined-{me}"), "w").close()
    while kv.current_clock < steps:
        c = kv.current_clock
        if mode == "host" and me == 0 and c == KILL_AT and not joined:
            print("READY", flush=True)
        if mode in ("grow", "dropserver") and me == 0 and c == 2:
            open(os.path.join(flagdir, mode.replace("server", "")), "w").close()
        if not joined and c == WAIT_AT:
            deadline = time.monotonic() + 60
            while sum(f.startswith("joined-") for f in os.listdir(flagdir)) < joins:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{joins} replacements did not join within 60 s")
                time.sleep(0.05)
        if mode == "killserver" and me == 0 and c == 2:
            rt = current()
            os.kill(rt.infos[rt.size - 1].pid, signal.SIGKILL)  # type: ignore[attr-defined]
        w = kv.pull("w")["w"]
        print(f"PULL {me} {c} {w[0]:g}", flush=True)
        kv.push({"w": np.full(8, me + 1.0)})
        if mode in ("bsp", "ssp") and not joined and me == 1 and c == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        kv.clock()
    kv.barrier()
    print(f"FINAL {me} {kv.current_clock} {kv.pull('w')['w'].tolist()}", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
