"""No shared memory outlives a c10d job started without unison's launcher.

A rank killed between creating its /dev/shm segment and unlinking it (torchrun,
mpirun: no launcher of unison's cleans after it) leaves the segment's name; the
next c10d job of the user on the host removes it (its owner's pid is in the name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from unison.transport.shm_segment import SHM_DIR

from ._util import free_port
from .test_trust import RANK, torchrun_env

ROOT = Path(__file__).resolve().parents[2]
ORPHAN = """
import os, signal, sys
from unison.transport.shm_segment import Segment
seg = Segment.create("", 0, 9 << 20)  # a rank's segment, not yet unlinked
print(seg.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(300)
def test_segment_of_a_rank_killed_before_unlinking_is_removed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("UNISON_JOB_ID", None)
    dead = subprocess.run(
        [sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True, timeout=120
    )
    assert dead.returncode == -signal.SIGKILL, dead.stderr
    path = dead.stdout.strip()
    assert os.path.dirname(path) == SHM_DIR and os.path.exists(path), path
    try:
        script = tmp_path / "rank.py"
        script.write_text(RANK)
        port = free_port()
        ranks = [
            subprocess.Popen(
                [sys.executable, str(script)],
                env=torchrun_env(r, 2, port, agent=False),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=200)[0] for p in ranks]
        for p, out in zip(ranks, outs, strict=True):
            assert p.returncode == 0 and "RESULT [3.0, 3.0, 3.0]" in out, out
        assert not os.path.exists(path), f"{path} is still there"
        mine = [n for n in os.listdir(SHM_DIR) if n.startswith("unison-nojob-")]
        assert all(str(p.pid) not in n for n in mine for p in ranks), mine
    finally:
        if os.path.exists(path):
            os.unlink(path)
