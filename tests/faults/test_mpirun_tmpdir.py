"""A user's own ``mpirun`` gives no store address: ranks meet in a file store at
``/tmp/unison-ompi-<job>`` that nothing else removes. The last rank out removes it,
after a clean end and after an exception on every rank alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys
import numpy as np, unison as un
from unison.jobenv import detect_job
print("PATH", detect_job(dict(os.environ)).store_path, flush=True)
un.init()
x = np.full(3, un.rank() + 1.0)
un.all_reduce(x)
assert (x == 3.0).all()
un.barrier()
if sys.argv[1] == "fail":
    raise RuntimeError("the user's script fails on every rank")
"""


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


MPIRUN = _mpirun()
pytestmark = [
    pytest.mark.skipif(MPIRUN is None, reason="no mpirun: pip install 'unison-collectives[mpi]'"),
    pytest.mark.timeout(120),
]


def test_file_store_directory_removed_after_clean_and_failed_runs(tmp_path: Path) -> None:
    assert MPIRUN is not None
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "OMPI_", "PMIX"))}
    env.update(PYTHONPATH=str(ROOT), UNISON_TIMEOUT="60")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    for mode, want_ok in (("ok", True), ("fail", False)):
        proc = subprocess.run(
            [MPIRUN, "-np", "2", "--oversubscribe", *root, sys.executable, str(script), mode],
            env=env, capture_output=True, text=True, timeout=100,
        )  # fmt: skip
        assert (proc.returncode == 0) == want_ok, proc.stdout + proc.stderr
        paths = {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("PATH")}
        assert len(paths) == 1, proc.stdout + proc.stderr
        path = paths.pop()
        assert path.startswith("/tmp/unison-ompi-"), path
        assert not os.path.exists(path), f"{mode}: {path} left behind"
        if not want_ok:
            assert "the user's script fails on every rank" in proc.stderr
