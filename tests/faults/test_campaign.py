"""The short part of the fault campaign (``make faults`` runs all of it): a killed rank
and a root mismatch on the native engine, strangers at the store, with leftovers checked
after each case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison.testing.campaign import CASES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_campaign_keeps_every_promise() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "unison.testing.campaign", "--quick"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    lines = proc.stdout.splitlines()
    quick = [c.name for c in CASES if c.quick]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    for name in quick:
        row = next((ln for ln in lines if ln.startswith(name + " ")), None)
        assert row is not None and row.split()[1] == "ok", proc.stdout
        assert "none;" in row, row  # no leftovers
    assert f"{len(quick)} of {len(quick)} cases as promised" in proc.stdout
