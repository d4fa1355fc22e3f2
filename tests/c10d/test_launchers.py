"""An unchanged ``init_process_group(...)`` (default ``env://``) under mpirun and Slurm:
after ``import unison.torch.distributed`` the rendezvous gets the torchrun variables
those launchers do not set. Real mpirun, and srun's environment on one host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from unison.torch.distributed._launchers import PORT_BASE, PORT_SPAN, launcher_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
import unison.torch.distributed  # the only unison line
dist.init_process_group(sys.argv[1])
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(4, dtype=torch.float64) * (r + 1)
dist.all_reduce(t)
g = [None] * n
dist.all_gather_object(g, os.environ["MASTER_PORT"])
print("RESULT " + json.dumps({
    "rank": r, "size": n, "backend": dist.get_backend(), "sum": t.tolist(), "ports": g,
    "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE", "MASTER_ADDR")},
}), flush=True)
dist.destroy_process_group()
"""
OURS = ("UNISON_", "OMPI_", "PMIX", "PRTE", "SLURM_", "PMI_", "TORCHELASTIC")
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(OURS) and k not in (*TORCHRUN, "MASTER_ADDR", "MASTER_PORT")
    }
    return {**env, "PYTHONPATH": str(ROOT), "UNISON_TIMEOUT": "60"}


def _results(stdout: str, size: int) -> list[dict]:
    res = [json.loads(x[7:]) for x in stdout.splitlines() if x.startswith("RESULT ")]
    return sorted(res, key=lambda d: d["rank"])


def _check(res: list[dict], backend: str, size: int, text: str) -> None:
    assert len(res) == size, text
    want = (np.arange(4) * sum(range(1, size + 1))).tolist()
    for r, d in enumerate(res):
        assert (d["rank"], d["size"], d["backend"]) == (r, size, backend), d
        assert d["sum"] == want, d
        assert d["env"]["RANK"] == str(r) and d["env"]["WORLD_SIZE"] == str(size), d
        assert d["env"]["LOCAL_RANK"] == str(r) and d["env"]["LOCAL_WORLD_SIZE"] == str(size)
        assert len(set(d["ports"])) == 1, d  # every rank derived the same port
        assert PORT_BASE <= int(d["ports"][0]) < PORT_BASE + PORT_SPAN


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


@pytest.mark.skipif(_mpirun() is None, reason="no mpirun: pip install 'unison-collectives[mpi]'")
@pytest.mark.parametrize("backend", ["unison", "gloo"])
def test_unchanged_script_under_mpirun(tmp_path: Path, backend: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    mpirun = _mpirun()
    assert mpirun is not None
    proc = subprocess.run(
        [mpirun, "-np", "2", "--oversubscribe", *root, sys.executable, str(script), backend],
        env=_clean_env(), capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    res = _results(proc.stdout, 2)
    _check(res, backend, 2, text)
    assert all(d["env"]["MASTER_ADDR"] == "127.0.0.1" for d in res)


def test_unchanged_script_under_slurm_environment(tmp_path: Path) -> None:
    """srun's variables for a 2-task step on one node, each rank its own process."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    job = str(1000 + os.getpid() % 100000)
    procs = []
    for r in range(2):
        env = {
            **_clean_env(),
            "SLURM_PROCID": str(r),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(r),
            "SLURM_NODEID": "0",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_STEP_NUM_NODES": "1",
            "SLURM_JOB_ID": job,
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_JOB_NODELIST": "localhost",
        }
        cmd = [sys.executable, str(script), "unison"]
        pipe = subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True))
    outs = [p.communicate(timeout=110) for p in procs]
    text = "\n".join(o + e for o, e in outs)
    assert all(p.returncode == 0 for p in procs), text
    res = _results("\n".join(o for o, _ in outs), 2)
    _check(res, "unison", 2, text)
    assert all(d["env"]["MASTER_ADDR"] == "localhost" for d in res)
    assert res[0]["ports"][0] == str(PORT_BASE + zlib.crc32(f"slurm-{job}.0".encode()) % PORT_SPAN)


def test_launcher_env_fills_only_what_is_absent() -> None:
    ompi = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_NAMESPACE": "prterun-h-7@1",
    }
    got = launcher_env(ompi)  # two hosts: no address every rank can derive
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "4" and got["LOCAL_RANK"] == "1"
    assert "MASTER_ADDR" not in got and got["LOCAL_WORLD_SIZE"] == "2"
    other = launcher_env({**ompi, "OMPI_COMM_WORLD_RANK": "3"})
    assert other["MASTER_PORT"] == got["MASTER_PORT"]
    assert (
        launcher_env({**ompi, "PMIX_NAMESPACE": "prterun-h-8@1"})["MASTER_PORT"]
        != got["MASTER_PORT"]
    )
    assert launcher_env({**ompi, "MASTER_ADDR": "h0"}).get("MASTER_ADDR") is None  # kept
    # torchrun, `unison run` and no launcher: nothing
    assert launcher_env({**ompi, "RANK": "1", "WORLD_SIZE": "4"}) == {}
    assert launcher_env({**ompi, "UNISON_RANK": "1"}) == {}
    assert launcher_env({}) == {}
    # PMI (MPICH/Intel MPI) under srun: Slurm's node list gives the address
    pmi = {
        "PMI_RANK": "0",
        "PMI_SIZE": "4",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_ID": "55",
        "SLURM_STEP_NODELIST": "n[07-08]",
    }
    got = launcher_env(pmi)
    assert got["MASTER_ADDR"] == "n07" and got["RANK"] == "0" and "LOCAL_RANK" not in got
    slurm = {k: v for k, v in pmi.items() if not k.startswith("PMI_")}
    assert launcher_env({**slurm, "SLURM_NODEID": "1"})["GROUP_RANK"] == "1"
    assert launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) == {}  # no node list
