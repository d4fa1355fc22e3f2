"""`unison run --servers N`: servers exit cleanly when the job ends; a dead worker fails the job."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

CLI = [sys.executable, "-m", "unison.launch.cli", "run"]

SCRIPT = """
import os, sys
import numpy as np
import unison.ps as ps

kv = ps.init(consistency=ps.SSP(staleness=1))      # servers serve here, then exit
kv.init_params({"w": np.zeros(64), "b": np.zeros(1)})
kv.set_optimizer(ps.SGD(lr=0.1, momentum=0.9))
for step in range(10):
    p = kv.pull(["w", "b"])
    kv.push({"w": np.ones(64), "b": np.ones(1)})
    kv.clock()
    if os.environ.get("DIE") == str(kv.rank) and step == 3:
        os._exit(5)
print("worker", kv.rank, "of", kv.num_workers, "servers", list(kv.servers), "done")
"""


def _run(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train_ps.py"
    script.write_text(textwrap.dedent(SCRIPT))
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*CLI, *args, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=50,
        env=full_env,
    )


def test_servers_flag_runs_a_job_and_servers_exit_cleanly(tmp_path: Path) -> None:
    out = _run(tmp_path, "-np", "4", "--servers", "2", "--timeout", "15")
    assert out.returncode == 0, out.stderr
    for w in range(2):
        assert f"worker {w} of 2 servers [2, 3] done" in out.stdout
    assert "Traceback" not in out.stderr


def test_dead_worker_fails_the_job_naming_its_rank(tmp_path: Path) -> None:
    out = _run(tmp_path, "-np", "4", "--servers", "1", "--timeout", "10", env={"DIE": "1"})
    assert out.returncode == 5, (out.stdout, out.stderr)
    assert "rank 1 failed first" in out.stderr


def test_servers_flag_is_validated(tmp_path: Path) -> None:
    out = _run(tmp_path, "-np", "2", "--servers", "2")
    assert out.returncode == 2 and "--servers" in out.stderr
