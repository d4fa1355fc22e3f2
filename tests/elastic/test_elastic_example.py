"""examples/elastic_digits.py loses a host mid-training and still reaches the accuracy bar
of the non-elastic examples/pytorch_digits.py (95 %), with identical parameters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytestmark = pytest.mark.timeout(200)
ROOT = Path(__file__).resolve().parents[2]


def test_digits_survive_a_lost_host(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "unison.launch.cli", "run", "--timeout", "60",
        "-np", "4", "--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2",
        sys.executable, str(ROOT / "examples" / "elastic_digits.py"),
        "--epochs", "4", "--lose-host-at", "20",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=190, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = r.stdout
    assert "losing host 127.0.0.1 at step 20" in out
    assert "reset: now 2 workers (round 1)" in out
    assert "parameters identical on all 2 ranks: yes" in out and out.rstrip().endswith("OK")
    assert "elastic reset 1: rank " in r.stderr and "world 1: 2 ranks (localhost:2)" in r.stderr
    for line in out.splitlines():
        if "recovered:" in line or "test accuracy" in line:
            print("\n" + line)
