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


def test_leftovers_are_the_jobs_own_segments_not_another_jobs() -> None:
    """A segment named for the case's job is its leftover; one of another job on the
    host (a test running beside the campaign) is not."""
    from unison.testing.campaign import _leftovers, _listening, _segments
    from unison.transport.shm_segment import SHM_DIR, segment_prefix

    if not os.path.isdir(SHM_DIR):
        pytest.skip(f"no {SHM_DIR} here")
    seg0, ports0 = _segments(), _listening()
    tag = os.urandom(4).hex()
    mine = f"{segment_prefix(f'campaign-{tag}')}r0-1-0"
    launched = f"{segment_prefix(f'1-424242-{tag}')}r1-2-0"  # unison run's id: its pid
    theirs = f"{segment_prefix(f'other-{tag}')}r0-3-0"
    paths = [os.path.join(SHM_DIR, n) for n in (mine, launched, theirs)]
    try:
        for p in paths:
            Path(p).touch()
        marks = (segment_prefix(f"campaign-{tag}"), "-424242-")
        left = _leftovers(f"no-such-job-{tag}", seg0, ports0, marks)
    finally:
        for p in paths:
            Path(p).unlink(missing_ok=True)
    assert sorted(left) == sorted([f"segment {mine}", f"segment {launched}"]), left
