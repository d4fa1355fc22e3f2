"""The examples run unchanged: the seeds' snippets on both APIs, DDP digits to >= 95%, and
an unchanged DDP script under `unison run` with backend "unison" and "gloo"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ._util import run_script

EX = Path(__file__).resolve().parents[2] / "examples"
HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", ["seeds_p2p_native.py", "seeds_p2p_c10d.py"])
def test_seed_snippets(name: str) -> None:
    run_script(str(HERE / name), 2)


@pytest.mark.timeout(300)
def test_ddp_digits_reaches_95_percent_with_identical_parameters() -> None:
    # the script itself exits non-zero below --min-accuracy (0.95) or if ranks differ
    run_script(str(EX / "ddp_digits.py"), 2, timeout=280)


DDP_SCRIPT = """\
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import unison.torch.distributed  # registers the backend "unison"

dist.init_process_group(sys.argv[1])  # env://: unison run exports RANK, MASTER_ADDR...
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print("PARAMS", dist.get_backend(), " ".join(f"{v:.6f}" for v in flat.tolist()), flush=True)
dist.destroy_process_group()
"""


def test_unchanged_ddp_script_under_unison_run(tmp_path: Path) -> None:
    """The same DDP script, launched by `unison run` with backend "unison" and "gloo":
    identical parameters on both ranks, equal (to float tolerance) across backends."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(EX.parent))
    params = {}
    for backend in ("unison", "gloo"):
        # The Gloo run is the oracle, not the product: one retry if it fails. A unison run
        # that fails is ours and fails the test (CI once saw rank 0 end with "terminate
        # called without an active exception" here without saying which run it was).
        for _attempt in range(2 if backend == "gloo" else 1):
            r = subprocess.run(
                [sys.executable, "-m", "unison", "run", "-np", "2", sys.executable,
                 str(script), backend],
                capture_output=True, text=True, env=env, timeout=100,
            )  # fmt: skip
            if r.returncode == 0:
                break
        assert r.returncode == 0, f"backend {backend}: exit {r.returncode}\n{r.stderr}\n{r.stdout}"
        lines = sorted(x for x in r.stdout.splitlines() if "PARAMS" in x)
        assert len(lines) == 2, r.stdout
        got = [line.split("PARAMS ", 1)[1].split() for line in lines]
        assert got[0][0] == backend and got[0] == got[1], got  # identical on both ranks
        params[backend] = np.array([float(v) for v in got[0][1:]])
    assert np.allclose(params["unison"], params["gloo"], atol=1e-5), params
