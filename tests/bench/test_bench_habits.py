"""unison bench in nccl-tests' habits: rows print as they are measured, -b/-e/-f/-n/-w/-c,
an average bus bandwidth per implementation, a legend for the ratio columns, one table
per job under a launcher, and a warning when the machine is busy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unison.bench import cli
from unison.launch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ROW_OPS = ("all_reduce", "all_gather", "broadcast", "barrier")


def _args(*argv: str) -> Any:
    return build_parser("bench").parse_args(["bench", *argv])


def _bench(*argv: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unison", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
    )


def _row_lines(text: str) -> list[list[str]]:
    """The printed rows: [op, size, count, time, algbw, busbw, #wrong] each."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("[") and parts[0].endswith("]"):
            parts = parts[1:]  # unison run's rank prefix
        if parts and parts[0] in ROW_OPS:
            out.append(parts)
    return out


@pytest.mark.timeout(200)
def test_rows_print_while_the_sweep_still_runs() -> None:
    """The first row reaches stdout while the benchmark process is still running (the
    64 MiB row after it takes many iterations), not with the table at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unison", "bench", "-np", "2", "--sizes", "8,64M",
         "-n", "20", "-w", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        still_running = None
        for line in proc.stdout:
            if _row_lines(line):
                still_running = proc.poll() is None
                break
        assert still_running is True, "the first row came only once the sweep had ended"
        rest = proc.stdout.read()
        assert proc.wait(timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [r[1] for r in _row_lines(rest)] == ["64M"]


@pytest.mark.timeout(200)
def test_nccl_tests_flags(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    r = _bench("-np", "2", "--ops", "all_reduce", "-b", "8", "-e", "32", "-f", "2",
               "-n", "3", "-w", "1", "-c", "2", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [x["size"] for x in rows] == [8, 16, 32]  # -b 8 -e 32 -f 2
    assert all(x["iters"] == 3 and x["correct"] is True for x in rows)  # -n 3, checked
    assert [p[-1] for p in _row_lines(r.stdout)] == ["0", "0", "0"]  # no wrong results
    # -c 0: nothing checked, and the rows say so
    r = _bench("-np", "2", "--ops", "all_reduce", "-b", "1K", "-e", "1K", "-n", "2",
               "-c", "0", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["correct"] is None and row["size"] == 1024
    assert _row_lines(r.stdout)[0][-1] == "N/A"


def test_size_flags_parse_as_nccl_tests_does() -> None:
    assert cli._sizes(_args("-b", "1K", "-e", "8K", "-f", "4")) == [1024, 4096]
    assert cli._sizes(_args("-b", "64M")) == [64 << 20, 128 << 20, 256 << 20]
    assert cli._sizes(_args("-e", "32")) == [8, 16, 32]
    assert cli._sizes(_args()) == cli.parse_sizes(cli.DEFAULT_SIZES)
    r = _bench("--sizes", "8", "-b", "16")
    assert r.returncode == 2 and "not both" in r.stderr


@pytest.mark.timeout(250)
def test_average_bus_bandwidth_and_the_legend(tmp_path: Path) -> None:
    peers = [p for p in ("gloo",) if cli.missing(p) is None]
    out = tmp_path / "b.json"
    argv = ["-np", "2", "--ops", "all_reduce,barrier", "--sizes", "1K,64K", "-n", "3",
            "-w", "1", "--json", str(out)]  # fmt: skip
    r = _bench(*argv, *(["--compare", ",".join(peers)] if peers else []))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    for impl in ["unison", *peers]:
        (line,) = [x for x in r.stdout.splitlines() if x.startswith(f"# {impl}: Avg bus")]
        want = np.mean([x["busbw"] for x in rows if x["impl"] == impl and x["size"] > 0])
        assert float(line.split(":")[2].split()[0]) == pytest.approx(want, abs=5e-4), line
    if peers:
        assert "# xgloo: the peer's time divided by unison's" in r.stdout
    else:
        assert "xgloo" not in r.stdout


def _one_table(stdout: str, sizes: int) -> None:
    heads = [x for x in stdout.splitlines() if "# unison: np=2" in x]
    assert len(heads) == 1, stdout  # one table for the job, from rank 0
    assert len(_row_lines(stdout)) == sizes, stdout
    assert sum("Avg bus bandwidth" in x for x in stdout.splitlines()) == 1, stdout


def _mpirun() -> str | None:
    return shutil.which("mpirun", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                          os.environ.get("PATH", "")]))  # fmt: skip


@pytest.mark.timeout(200)
@pytest.mark.skipif(
    _mpirun() is None or cli.missing("mpi") is not None,
    reason="mpirun or mpi4py missing: pip install 'unison-collectives[mpi]'",
)
def test_one_table_under_mpirun(tmp_path: Path) -> None:
    mpirun = _mpirun()
    assert mpirun is not None
    out = tmp_path / "b.json"
    cmd = [mpirun, "--oversubscribe", "-np", "2"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    r = subprocess.run(
        [*cmd, sys.executable, "-m", "unison", "bench", "--backend", "mpi", "--sizes", "8,4K",
         "-n", "3", "-w", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=180, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    _one_table(r.stdout, 2)
    data = json.loads(out.read_text())
    assert data["meta"]["np"] == 2 and data["meta"]["backend"] == "mpi"
    assert [x["size"] for x in data["rows"]] == [8, 4096]
    assert all(x["correct"] for x in data["rows"])


@pytest.mark.timeout(200)
def test_one_table_under_unison_run() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "unison", "run", "-np", "2", sys.executable, "-m", "unison",
         "bench", "--sizes", "8,4K", "-n", "3", "-w", "1"],
        capture_output=True, text=True, timeout=180, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    _one_table(r.stdout, 2)
    assert all(x.startswith("[0]") for x in r.stdout.splitlines() if x.strip())


def test_busy_threshold() -> None:
    assert cli.busy(0.5, 2) is None
    assert cli.busy(0.61, 2) is not None and "busy" in str(cli.busy(0.61, 2))
    assert cli.busy(4.0, 16) is None


@pytest.mark.parametrize(("load", "warned"), [(9.5, True), (0.0, False)])
def test_busy_machine_is_warned_before_the_sweep(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], load: float, warned: bool
) -> None:
    order: list[str] = []
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(cli, "_cores", lambda: 2)
    monkeypatch.setattr(cli, "_launched_rank", lambda: None)

    def fake_run(impl: str, *a: object, **k: object) -> tuple[list[Any], None]:
        order.append("sweep")
        return [], None

    monkeypatch.setattr(cli, "run_impl", fake_run)
    cli.main(_args("--sizes", "8"))
    err = capsys.readouterr().err
    assert order == ["sweep"]
    assert ("warning: this machine is busy (1-minute load average 9.50 on 2 cores)" in err) is (
        warned
    ), err


def test_tcp_transport_holds_the_mpi_peer_to_tcp() -> None:
    tcp = cli.mpi_mca({"UNISON_TRANSPORT": "tcp"}, [], None)
    assert tcp == {"pml": "ob1", "btl": "tcp,self", "btl_tcp_if_include": "lo"}
    across = cli.mpi_mca({"UNISON_TRANSPORT": "tcp"}, ["btl_tcp_if_include=10.0.0.0/24"],
                         [("a", 1), ("b", 1)])  # fmt: skip
    assert across == {"pml": "ob1", "btl": "tcp,self", "btl_tcp_if_include": "10.0.0.0/24"}
    assert cli.mpi_mca({}, ["btl=self"], None) == {"btl": "self"}  # auto: Open MPI chooses
    excl = cli.mpi_mca({"UNISON_TRANSPORT": "tcp"}, ["btl_tcp_if_exclude=eth1"], None)
    assert "btl_tcp_if_include" not in excl  # Open MPI refuses both
    with pytest.raises(cli.InvalidArgumentError):
        cli.mpi_mca({}, ["btl"], None)


@pytest.mark.timeout(200)
@pytest.mark.skipif(
    _mpirun() is None or cli.missing("mpi") is not None,
    reason="mpirun or mpi4py missing: pip install 'unison-collectives[mpi]'",
)
def test_mpi_peer_takes_the_mca_parameters(tmp_path: Path) -> None:
    """The parameters reach mpirun: over TCP only the 2-rank job runs and is recorded;
    with no byte transfer layer but self its ranks cannot reach each other and fail."""
    out = tmp_path / "b.json"
    base = ["-np", "2", "--sizes", "8,4K", "-n", "3", "-w", "1", "--compare", "mpi",
            "--transport", "tcp", "--json", str(out)]  # fmt: skip
    r = _bench(*base)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["mpi_mca"]["btl"] == "tcp,self", data["meta"]
    assert [x["correct"] for x in data["rows"] if x["impl"] == "mpi"] == [True, True]
    r = _bench(*base, "--mpi-mca", "btl=self")
    data = json.loads(out.read_text())
    assert "mpi" in data["meta"]["skipped"] and data["meta"]["mpi_mca"]["btl"] == "self", data
