"""``unison info --json`` for scripts, and ``unison completion bash|zsh`` completing the
subcommands and each subcommand's flags (the bash script is run by bash here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unison.launch import cli
from unison.launch.shell_completion import flags_by_subcommand

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HOROVOD_AUTOTUNE="1")


def _unison(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unison", *argv], capture_output=True, text=True, env=ENV,
        timeout=100,
    )  # fmt: skip


def test_info_json_is_the_facts_the_text_shows() -> None:
    r = _unison("info", "--json", "--config")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["transports"]["tcp"] is True and data["backends"]["native"] is True
    assert data["python"] == ".".join(map(str, sys.version_info[:3]))
    assert data["config"]["knobs"]["UNISON_TIMEOUT"] == {
        "value": 300.0, "set": False, "doc": "default deadline in seconds of every blocking call",
    }  # fmt: skip
    assert data["config"]["horovod_aliases"]["HOROVOD_LOG_LEVEL"] == "UNISON_LOG_LEVEL"
    assert "HOROVOD_AUTOTUNE" in data["config"]["ignored"]
    text = _unison("info").stdout
    assert f"numpy {data['numpy']}" in text and text.startswith(f"unison {data['unison']}")


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one is being typed)."""
    line = " ".join(f"'{w}'" for w in words)
    code = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _unison; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_bash_completion_completes_subcommands_and_flags() -> None:
    r = _unison("completion", "bash")
    assert r.returncode == 0, r.stderr
    script = r.stdout
    assert _complete(script, "unison", "") == [*cli.SUBCOMMANDS, "--help", "--version"]
    assert _complete(script, "unison", "in") == ["info"]
    assert _complete(script, "unison", "run", "--fusion") == ["--fusion-threshold-mb"]
    assert _complete(script, "unison", "run", "-np", "2", "--nproc") == [
        "--nproc-per-node", "--nproc_per_node",
    ]  # fmt: skip
    assert _complete(script, "unison", "info", "--j") == ["--json"]
    assert "--sizes" in _complete(script, "unison", "bench", "--")


def test_zsh_completion_names_every_flag() -> None:
    r = _unison("completion", "zsh")
    assert r.returncode == 0 and r.stdout.startswith("#compdef unison"), r.stderr
    for name, flags in flags_by_subcommand().items():
        assert f"            {name}) flags=({' '.join(flags)}) ;;" in r.stdout, name
    if shutil.which("zsh"):
        check = subprocess.run(["zsh", "-n"], input=r.stdout, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr
    r = _unison("completion", "fish")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
