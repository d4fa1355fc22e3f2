"""unison bench as a tool: usage errors, --plot checked first, Ctrl-C, temp dirs, --calibrate."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from unison.bench import cli
from unison.launch.cli import build_parser


def _args(*argv: str) -> Any:
    return build_parser("bench").parse_args(["bench", *argv])


def _unison(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unison.launch.cli", *argv],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(120)
def test_bad_arguments_are_usage_errors_not_tracebacks() -> None:
    for argv in (
        ["--sizes", "lots"],
        ["--ops", "all_reduce,teleport"],
        ["-np", "0"],
        ["--compare", "nccl"],
        ["--iters", "-1"],
    ):
        r = _unison("bench", *argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert "unison bench: error:" in r.stderr and "Traceback" not in r.stderr, argv


def test_plot_without_matplotlib_fails_before_the_sweep(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    ran: list[str] = []
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec -> None: not importable
    monkeypatch.setattr(cli, "run_impl", lambda impl, *a, **k: ran.append(impl) or ([], None))
    assert cli.main(_args("--plot", "x.png", "--sizes", "8")) == 2
    assert ran == [], "the sweep ran although the plot could not be drawn"
    assert "matplotlib" in capsys.readouterr().err


def test_ctrl_c_stops_the_whole_sweep(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    ran: list[str] = []

    def interrupted(impl: str, *a: object, **k: object) -> tuple[list[Any], None]:
        ran.append(impl)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_impl", interrupted)
    monkeypatch.setattr(cli, "missing", lambda impl: None)
    assert cli.main(_args("--compare", "gloo,mpi", "--sizes", "8")) == 130
    assert ran == ["unison"], "later implementations ran after Ctrl-C"
    assert "interrupted" in capsys.readouterr().err


def test_interrupted_job_status_stops_the_sweep_and_mpi_store_is_in_the_temp_dir(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    seen: dict[str, str] = {}

    def fake_run(cmd: list[str], env: dict[str, str], timeout: float) -> Any:
        seen["store"] = env["UNISON_STORE_PATH"]
        os.makedirs(env["UNISON_STORE_PATH"])  # what the ranks' file store does
        return subprocess.CompletedProcess(cmd, 130)

    monkeypatch.setattr(cli, "_mpirun", lambda: "mpirun")
    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    spec = cli.BenchSpec(("all_reduce",), (8,), "float32", 1, 0, True)
    with pytest.raises(KeyboardInterrupt):
        cli.run_impl("mpi", spec, 2, dict(os.environ), 10.0)
    store = Path(seen["store"])
    assert store.parent.name.startswith("unison-bench-")
    assert Path(tempfile.gettempdir()) in store.parents
    assert not store.parent.exists(), "the bench temp dir survived an interrupted run"


@pytest.mark.timeout(120)
def test_calibrate_measures_and_caches(tmp_path: Path) -> None:
    r = _unison("bench", "--calibrate", env={"UNISON_LINK_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "shm: alpha" in r.stdout and "tcp: alpha" in r.stdout
    assert len(list(tmp_path.glob("linkmodel-*.json"))) == 1


@pytest.mark.timeout(120)
def test_simulate_bad_arguments_are_usage_errors() -> None:
    for argv in (["-np", "0"], ["--link", "garbage"], ["--size", "huge"]):
        r = _unison("simulate", *argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert "unison simulate: error:" in r.stderr and "Traceback" not in r.stderr, argv
