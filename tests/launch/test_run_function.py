"""``unison.run(fn, args, np=...)``, Horovod's programmatic launcher: each rank's return
value in rank order, a rank's exception raised in the caller naming the rank, and
Horovod's own example structure (``import unison as horovod``) needing only the import
change."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import unison
from unison.errors import InvalidArgumentError, LaunchError, UnsupportedError

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _ranks_import_the_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), path) if p))


def summed(base: float, scale: float = 1.0) -> tuple[int, list[float]]:
    """All-reduce rank-dependent data; return (rank, the sum)."""
    unison.init()
    try:
        x = np.arange(4, dtype=np.float64) * scale + base + unison.rank()
        unison.all_reduce(x)
        return unison.rank(), x.tolist()
    finally:
        unison.shutdown()


def fails_on(rank: int) -> int:
    me = int(os.environ["UNISON_RANK"])
    if me == rank:
        raise KeyError(f"no such key on rank {me}")
    return me


def exits_on(rank: int) -> int:
    me = int(os.environ["UNISON_RANK"])
    if me == rank:
        os._exit(3)
    return me


def test_results_come_back_in_rank_order() -> None:
    got = unison.run(summed, args=(10.0,), kwargs={"scale": 2.0}, np=3)
    for rank, (r, values) in enumerate(got):
        oracle = sum(np.arange(4) * 2.0 + 10.0 + k for k in range(3))
        assert r == rank and np.allclose(values, oracle), got
    assert unison.run(fails_on, args=(99,), num_proc=2) == [0, 1]  # horovod's num_proc


def test_a_rank_exception_is_raised_here_naming_the_rank() -> None:
    with pytest.raises(KeyError) as info:
        unison.run(fails_on, args=(1,), np=2)
    assert info.value.args == ("no such key on rank 1",)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 1 of unison.run" in notes and "fails_on" in notes, notes
    with pytest.raises(LaunchError, match=r"exit status 3; ranks without a result: 0"):
        unison.run(exits_on, args=(0,), np=2)


def says_hello() -> int:
    print(f"hello from {os.environ['UNISON_RANK']}", flush=True)
    return 1


def test_output_reaches_a_text_stream_without_a_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    out, err = io.StringIO(), io.StringIO()  # a notebook's streams have no .buffer
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert unison.run(says_hello, np=2) == [1, 1]
    assert sorted(out.getvalue().splitlines()) == ["[0] hello from 0", "[1] hello from 1"]


def test_arguments_horovod_takes_and_unison_refuses() -> None:
    with pytest.raises(UnsupportedError, match="unison run --min-np"):
        unison.run(fails_on, args=(9,), np=2, min_num_proc=1)
    with pytest.raises(UnsupportedError, match="mpirun -np N -x UNISON_BACKEND=mpi"):
        unison.run(fails_on, args=(9,), np=2, use_mpi=True)
    with pytest.raises(InvalidArgumentError, match="np must be an integer >= 1"):
        unison.run(fails_on, np=0)
    with pytest.raises(InvalidArgumentError, match="hosts or hostfile"):
        unison.run(fails_on, np=1, hosts="localhost:1", hostfile="/nonexistent")


HOROVOD_STYLE = textwrap.dedent(
    """
    import argparse

    import torch
    import torch.nn.functional as F

    import unison as horovod
    import unison.torch as hvd

    parser = argparse.ArgumentParser()
    parser.add_argument("--num-proc", type=int)
    parser.add_argument("--hosts")
    parser.add_argument("--communication")
    parser.add_argument("--epochs", type=int, default=2)


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def forward(self, x):
            return F.log_softmax(self.fc(x), dim=1)


    def train(args):
        hvd.init()
        torch.manual_seed(42)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.none, op=hvd.Average,
        )
        g = torch.Generator().manual_seed(hvd.rank())
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        for _ in range(args.epochs):
            optimizer.zero_grad()
            F.nll_loss(model(x), y).backward()
            optimizer.step()
        loss = hvd.allreduce(F.nll_loss(model(x), y).detach(), name="avg_loss")
        return hvd.rank(), float(loss), model.fc.weight.detach().sum().item()


    if __name__ == "__main__":
        args = parser.parse_args()
        if args.num_proc:
            print("Running training through horovod.run")
            results = horovod.run(train, args=(args,), np=args.num_proc, hosts=args.hosts,
                                  use_gloo=args.communication == "gloo",
                                  use_mpi=args.communication == "mpi", verbose=2)
            print("RESULTS", results)
        else:
            train(args)
    """
)


def test_horovods_example_structure_needs_only_the_import_change(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "pytorch_mnist_like.py"
    script.write_text(HOROVOD_STYLE)
    r = subprocess.run(
        [sys.executable, str(script), "--num-proc", "2", "--communication", "gloo"],
        capture_output=True, text=True, timeout=170, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULTS "))
    results = eval(line.removeprefix("RESULTS "))  # a list of plain tuples
    assert [rank for rank, _, _ in results] == [0, 1]
    (loss0, w0), (loss1, w1) = [(loss, w) for _, loss, w in results]
    assert loss0 == pytest.approx(loss1) and w0 == pytest.approx(w1)  # one model everywhere


def test_horovods_top_level_names_are_here() -> None:
    for name in ("run", "__version__"):  # horovod/__init__.py offers these two
        assert hasattr(unison, name), name
