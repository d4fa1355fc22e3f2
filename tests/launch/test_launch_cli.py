"""The ``unison`` console script: --version, info, info --config, lazy subcommands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from unison._version import __version__
from unison.launch import cli

pytestmark = pytest.mark.timeout(60)

CLI = [sys.executable, "-m", "unison.launch.cli"]


def test_version() -> None:
    res = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=20)
    assert res.returncode == 0
    assert res.stdout.strip() == f"unison {__version__}"


def test_no_subcommand_prints_help() -> None:
    res = subprocess.run(CLI, capture_output=True, text=True, timeout=20)
    assert res.returncode == 2
    assert "run" in res.stderr and "info" in res.stderr


def test_info_and_config() -> None:
    env = {
        **os.environ,
        "UNISON_TIMEOUT": "42",
        "UNISON_TYPO_KNOB": "1",
        "UNISON_SECRET": "ab" * 32,
    }
    res = subprocess.run(
        [*CLI, "info", "--config"], capture_output=True, text=True, timeout=50, env=env
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.splitlines()[0] == f"unison {__version__}"
    import numpy

    assert f"numpy {numpy.__version__}" in out
    assert "python " in out and ("torch " in out or "torch: not installed" in out)
    assert "[X] tcp" in out and "[X] native" in out
    assert "shm" in out and "cma" in out and "mpi" in out
    from unison.config import KNOBS

    for knob in KNOBS:
        assert knob.env in out and knob.doc in out
    assert "UNISON_TIMEOUT" in out and "= 42.0" in out
    assert "UNISON_TYPO_KNOB" in out  # reported as unknown
    assert "ab" * 32 not in out  # the secret is never printed
    plain = subprocess.run([*CLI, "info"], capture_output=True, text=True, timeout=50)
    assert plain.returncode == 0 and "UNISON_TIMEOUT" not in plain.stdout


def test_run_does_not_import_torch_or_info() -> None:
    code = (
        "import sys\n"
        "from unison.launch import cli\n"
        "status = cli.main(['run', '-np', '1', sys.executable, '-c', 'pass'])\n"
        "print(status, 'torch' in sys.modules, 'unison.launch.info' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == ["0", "False", "False"], res.stderr


def test_subcommand_registry_is_lazy() -> None:
    assert set(cli.SUBCOMMANDS) >= {"run", "info"}
    parser = cli.build_parser(None)  # builds without importing any subcommand module
    assert parser.prog == "unison"


def test_python_m_unison_usage_errors_and_closed_pipe() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "unison", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == f"unison {__version__}"
    r = subprocess.run(
        [sys.executable, "-m", "unison", "run", "-np", "2", "--bogus", "true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("unison run: error:")  # run's own
    assert "--bogus" in r.stderr and "`unison run --help` lists the options" in r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr  # one line, not the usage text
    r = subprocess.run(
        f"{sys.executable} -m unison info --config | head -1", shell=True, capture_output=True,
        text=True, env=dict(os.environ, UNISON_TIMEOUTT="1"),
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.count("\n") == 1 and r.stderr == "", r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "unison", "run", "-np", "3", "-H", "localhost:2", "true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2 and "--oversubscribe" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "unison", "run", "-np", "3", "-H", "localhost:2",
         "--oversubscribe", "true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_nnodes_and_start_timeout() -> None:
    """torchrun's --nnodes takes the first N hosts (np = --nproc-per-node x N) and needs
    hosts when N > 1; horovodrun's --start-timeout must be a positive number of seconds."""
    run = [sys.executable, "-m", "unison", "run"]
    r = subprocess.run(
        [*run, "--nnodes", "1", "--nproc-per-node", "2", "-H", "localhost:2,elsewhere:2",
         "--start-timeout", "5", sys.executable, "-c",
         "import os; print('SIZE', os.environ['UNISON_SIZE'])"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr  # 'elsewhere' is never contacted
    assert sorted(r.stdout.splitlines()) == ["[0] SIZE 2", "[1] SIZE 2"], r.stdout
    for bad, says in (
        (["--nnodes", "2", "--nproc-per-node", "1"], "--nnodes 2 needs the hosts"),
        (["-np", "1", "--start-timeout", "0"], "--start-timeout must be > 0"),
    ):
        r = subprocess.run([*run, *bad, "true"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and says in r.stderr, r.stderr


def test_run_help_lists_the_flags_people_type() -> None:
    argv = [sys.executable, "-m", "unison", "run", "--help"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("usage: unison run"), r.stderr
    for flag in ("-x", "--oversubscribe", "--nproc-per-node", "--nproc_per_node", "--nnodes",
                 "--verbose", "--output-filename", "--tag-output", "--start-timeout",
                 "--network-interface", "--iface", "--stdin", "--hostfile", "-H"):  # fmt: skip
        assert f"{flag} " in r.stdout or f"{flag}," in r.stdout or f"{flag}\n" in r.stdout, flag
