"""The timeline is streamed: a rank killed with SIGKILL leaves a valid Chrome trace of
what it recorded (json.loads, as Perfetto and chrome://tracing read it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, signal, torch
import unison.torch as hvd
hvd.init()
for i in range(3):
    hvd.allreduce(torch.ones(8), name=f"t{i}")
hvd.allreduce(torch.ones(8), name="last")
if hvd.rank() == 0:
    print("RECORDED", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
hvd.barrier()
"""


def test_sigkilled_rank_leaves_a_valid_timeline(tmp_path: Path) -> None:
    script, trace = tmp_path / "job.py", tmp_path / "timeline.json"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOROVOD_TIMELINE=str(trace))
    r = subprocess.run(
        [sys.executable, "-m", "unison", "run", "-np", "2", "--timeout", "20",
         sys.executable, str(script)],
        capture_output=True, text=True, env=env, timeout=100,
    )  # fmt: skip
    assert "[0] RECORDED" in r.stdout, r.stderr
    assert "rank 0 failed first (killed by SIGKILL)" in r.stderr, r.stderr
    doc = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M"}
    assert {"t0", "t1", "t2", "last"} <= {n.split(".")[-1] for n in names} | names, names
    phases = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert "ALLREDUCE" in phases, phases
