"""Who can join a c10d job: the peer secret stays out of torch's store.

A job started the way torchrun starts one (``env://``, no ``UNISON_SECRET``) keeps its
secret in a file only its user can read; a process of another user on the host reads
the store (keys, addresses) and writes it, yet can neither read the secret, nor pass
the handshake as a rank, nor impersonate rank 0 behind a replaced address. Under
``unison run`` c10d uses the launcher's secret and the store holds none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = """
import json, os, sys
import torch, torch.distributed as dist
import unison.torch.distributed
dist.init_process_group("unison")
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("RESULT " + json.dumps(t.tolist()), flush=True)
dist.destroy_process_group()
"""
_DROP = ("UNISON_", "OMPI_", "PMIX", "PRTE", "SLURM_", "PMI_", "TORCHELASTIC")


def torchrun_env(rank: int, size: int, port: int, agent: bool = True) -> dict[str, str]:
    """torchrun's environment (no UNISON_* variable); ``agent``: the ranks are clients
    of the agent's store at ``port``, else rank 0 hosts the store there."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROP) and k not in ("XDG_RUNTIME_DIR", "TMPDIR")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        UNISON_TIMEOUT="120",
    )
    if agent:
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="trust")
    return env


def _stop(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.kill()
    out, _ = p.communicate(timeout=20)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
@pytest.mark.timeout(400)
def test_stranger_can_neither_read_the_secret_nor_join(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    from datetime import timedelta

    import torch.distributed as dist

    # the store torchrun's agent hosts (the ranks connect to it as clients)
    agent = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=200)
    )
    port = agent.port
    secret_dir = f"/tmp/unison-{os.geteuid()}"
    run = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "cwd": ROOT}
    rank0 = subprocess.Popen([sys.executable, str(script)], env=torchrun_env(0, 2, port), **run)
    stranger_env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
    }
    stranger = subprocess.Popen(
        [sys.executable, "-m", "tests.c10d._stranger", str(port), secret_dir],
        env=stranger_env,
        **run,
    )
    rank1 = None
    try:
        assert stranger.stdout is not None
        lines = []
        for line in stranger.stdout:
            lines.append(line)
            if line.strip() == "REPLACED":
                break
        assert lines and lines[-1].strip() == "REPLACED", "".join(lines) + _stop(rank0)
        rank1 = subprocess.Popen([sys.executable, str(script)], env=torchrun_env(1, 2, port), **run)
        out1, _ = rank1.communicate(timeout=150)
        rest, _ = stranger.communicate(timeout=150)
    finally:
        for p in (stranger, rank1):
            if p is not None and p.poll() is None:
                p.kill()
        out0 = _stop(rank0)
    report = next((json.loads(x[9:]) for x in rest.splitlines() if x.startswith("STRANGER ")), None)
    assert report is not None, rest
    text = json.dumps(report)
    assert report["uid"] != os.geteuid()
    assert any(k.endswith("/peer/0") for k in report["keys"]), text  # it did see the store
    assert not report["secret_read"], text
    assert report.get("file_error") == "PermissionError", text
    # with the job's own id (the file name is public), the handshake fails on the secret
    assert "AuthenticationError" in report["as_rank1"][0], text
    assert all("accepted" not in o for o in report["as_rank1"]), text
    assert not report["as_rank0"].startswith("accepted"), text
    # rank 1 found a listener that failed the handshake where rank 0 should be
    assert rank1 is not None and rank1.returncode != 0, out1
    assert "AuthenticationError" in out1 and "rank 0" in out1, out1
    assert "RESULT" not in out0, out0


def test_unison_run_uses_the_launchers_secret(tmp_path: Path) -> None:
    """Under `unison run` the ranks' peer secret is the launcher's; no secret, and no
    secret file name, goes into torch's store."""
    script = tmp_path / "job.py"
    script.write_text(
        "import json, os\n"
        "import torch, torch.distributed as dist\n"
        "import unison.torch.distributed\n"
        "from unison.world import current\n"
        "dist.init_process_group('unison')\n"
        "store = dist.distributed_c10d._get_default_store()\n"
        "keys = store.list_keys() if hasattr(store, 'list_keys') else []\n"
        "same = current().job.secret == bytes.fromhex(os.environ['UNISON_SECRET'])\n"
        "leak = [k for k in keys if 'secret' in k]\n"
        "t = torch.ones(2)\n"
        "dist.all_reduce(t)\n"
        "print('RESULT ' + json.dumps([same, leak, t.tolist()]), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "unison", "run", "-np", "2", "--timeout", "30"]
    proc = subprocess.run(
        [*cmd, sys.executable, str(script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    res = [json.loads(x.split("RESULT ", 1)[1]) for x in text.splitlines() if "RESULT " in x]
    assert len(res) == 2, text
    for same, leak, total in res:
        assert same and leak == [] and total == [2.0, 2.0], res
