"""The engine and the TensorFlow front need no other framework: real ranks under
``unison run -np 2``, each with an import hook that refuses the frameworks the job
must not touch (tests/horovod/_no_torch.py), results checked against numpy in the
ranks. The full check in a venv where torch is not installed at all is
``make test-notorch``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(refuse: str, script: str, timeout: float) -> None:
    env = dict(os.environ, UNISON_TIMEOUT="60", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "unison", "run", "-np", "2", sys.executable, "-m",
           "tests.horovod._no_torch", refuse, str(ROOT / "tests" / "horovod" / script)]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "ok 0" in out and "ok 1" in out, out[-4000:]


@pytest.mark.timeout(300)
def test_engine_moves_numpy_buffers_with_no_framework_importable() -> None:
    _run("torch,tensorflow,jax,keras", "_numpy_job.py", 240)


@pytest.mark.timeout(400)
@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="needs the [tensorflow] extra"
)
def test_unison_tensorflow_runs_with_torch_refused() -> None:
    _run("torch", "_tf_job.py", 360)
