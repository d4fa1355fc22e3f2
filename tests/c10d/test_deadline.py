"""The deadline of an unchanged DDP script is unison's (``unison run --timeout``), not
the 30 minutes torch hands every backend when the script passes no ``timeout=``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, time
import torch, torch.distributed as dist
import unison.torch.distributed
dist.init_process_group("unison")  # no timeout=: torch passes its 30-minute default
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if step == 3:
        if rank == 1:
            time.sleep(3600)  # stuck: alive, never joins this step's all_reduce
        start = time.monotonic()
    try:
        opt.zero_grad()
        model(torch.ones(2, 16)).sum().backward()
        opt.step()
    except Exception as exc:
        text = str(exc).replace("\\n", " ")
        print(f"FAILED {time.monotonic() - start:.2f} {type(exc).__name__}: {text}", flush=True)
        sys.exit(1)
print("FINISHED", flush=True)
"""


@pytest.mark.timeout(300)
def test_stuck_rank_fails_at_unison_run_timeout(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "unison", "run", "-np", "3", "--timeout", "8"]
    # --job-timeout ends a job still running at 150 s (torch's 30 minutes in effect)
    proc = subprocess.run(
        [*cmd, "--job-timeout", "150", sys.executable, str(script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=250,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124), text
    failed = {
        int(m.group(1)): (float(m.group(2)), m.group(3))
        for m in re.finditer(r"^\[(\d+)\].*?FAILED ([\d.]+) (.*)$", text, re.M)
    }
    assert sorted(failed) == [0, 2], text  # every rank that was not stuck
    for _rank, (elapsed, msg) in failed.items():
        # the deadline is 8 s; the slack is for a loaded machine, far below 1800 s
        assert 7.0 <= elapsed < 60.0, (elapsed, msg)
        assert "rank 1" in msg and "all_reduce" in msg, msg
        assert "CollectiveTimeoutError" in msg, msg
