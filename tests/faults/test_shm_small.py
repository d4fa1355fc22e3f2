"""A /dev/shm too small for the segments (a small tmpfs in a mount namespace, like a
container's): forced shared memory fails at init with an error naming the size and
the fix, never SIGBUS mid-collective; the default transport falls back to TCP. Room
for the segments but not for an arena: the group without one takes the message-based
algorithms."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import numpy as np, unison as un
un.init()
x = np.full(1 << 21, un.rank() + 1.0, np.float32)
un.all_reduce(x)
assert (x == sum(range(1, un.size() + 1))).all()
print("SUM OK", flush=True)
"""


def _why_not() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) to mount a small /dev/shm in a mount namespace"
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
        capture_output=True,
        timeout=30,
    )
    return None if r.returncode == 0 else f"cannot mount a tmpfs: {r.stderr!r}"


WHY = _why_not()


def _run_command(tmp_path: Path, script: str) -> str:
    """The shell command that runs ``script`` under ``unison run -np 2``."""
    path = tmp_path / "job.py"
    path.write_text(script)
    return f"{sys.executable} -m unison run -np 2 --timeout 30 {sys.executable} {path}"


def _with_shm_of(size: str, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``command`` in a mount namespace whose /dev/shm is a tmpfs of ``size``."""
    both = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && {command}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", both],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
        timeout=100,
    )


@pytest.mark.skipif(WHY is not None, reason=str(WHY))
def test_small_dev_shm_is_a_clear_error_or_tcp(tmp_path: Path) -> None:
    run = _run_command(tmp_path, SCRIPT)
    # each rank's set-up allocates about 3.4 MiB (rings and small-message slots): two
    # do not fit in 4 MB
    r = _with_shm_of("4m", f"UNISON_TRANSPORT=shm {run}; echo RC=$?; {run}")
    forced, _, auto = r.stdout.partition("RC=")
    assert "SUM OK" not in forced, r.stdout
    assert auto.startswith("1\n"), r.stdout  # exit 1 with the error, not 135 (SIGBUS)
    assert "SIGBUS" not in r.stderr
    assert "/dev/shm is too small" in r.stderr and "segment needs" in r.stderr, r.stderr
    assert "--shm-size" in r.stderr and "UNISON_TRANSPORT=tcp" in r.stderr
    assert auto.count("SUM OK") == 2, r.stdout + r.stderr  # the default falls back to TCP


@pytest.mark.skipif(WHY is not None, reason=str(WHY))
def test_no_room_for_the_world_arena_is_the_message_path(tmp_path: Path) -> None:
    # 16 MB hold both ranks' set-up (about 3.4 MiB each) but not both 8 MiB slots of the
    # world's arena, allocated as init ends: no SIGBUS, the result by the message-based
    # algorithms over shared memory (forced: no TCP fallback)
    run = _run_command(tmp_path, SCRIPT)
    r = _with_shm_of("16m", run, UNISON_LOG_LEVEL="INFO", UNISON_TRANSPORT="shm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUM OK") == 2, r.stdout + r.stderr
    assert "the world: no shared arena" in r.stderr, r.stderr
    assert "/dev/shm is too small" in r.stderr, r.stderr


GROUP_SCRIPT = """
import numpy as np, unison as un
from unison.world import current
un.init()
g = un.new_group([0, 1])
x = np.arange(3 << 20, dtype=np.float32) % 7 + un.rank()
un.all_reduce(x, group=g)
want = 2 * (np.arange(3 << 20, dtype=np.float32) % 7) + 1
assert np.array_equal(x, want)
arena = current().executors[g.id].topo.arena is not None
print(f"GROUP OK arena={arena}", flush=True)
"""


@pytest.mark.skipif(WHY is not None, reason=str(WHY))
def test_no_room_for_a_sub_group_arena_is_the_message_path(tmp_path: Path) -> None:
    # a 20 MB /dev/shm holds both ranks' set-up (about 3.4 MiB each) and one part of a
    # sub-group's 8 MiB arena, not both: no member uses it, no SIGBUS
    run = _run_command(tmp_path, GROUP_SCRIPT)
    env = {"UNISON_LOG_LEVEL": "INFO", "UNISON_GROUP_ARENA_BYTES": str(8 << 20)}
    r = _with_shm_of("20m", run, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("GROUP OK arena=False") == 2, r.stdout + r.stderr
    assert "no shared arena" in r.stderr, r.stderr
