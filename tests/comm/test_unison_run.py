"""Collectives through `unison run` itself: the example, and a failing rank."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unison.launch.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.timeout(90)
def test_primitives_example_runs_under_unison_run() -> None:
    out = _run(["-np", "3", sys.executable, "examples/primitives.py"])
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[0] ok")]
    assert len(lines) >= 14, out.stdout
    assert "all_reduce SUM over 3 ranks -> 3" in out.stdout


@pytest.mark.timeout(60)
def test_exception_in_one_rank_ends_the_job_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        textwrap.dedent("""
        import numpy as np, unison as un
        un.init()
        un.barrier()
        if un.rank() == 1:
            raise ValueError("boom in rank one")
        un.all_reduce(np.ones(10))
        un.all_reduce(np.ones(10))
    """)
    )
    start = time.monotonic()
    out = _run(["-np", "3", sys.executable, str(script)])
    assert time.monotonic() - start < 30
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "rank 1" in out.stderr and "ValueError: boom in rank one" in out.stderr, out.stderr
