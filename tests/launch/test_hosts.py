"""Host lists, hostfiles, rank placement and remote-shell commands of ``unison run -H``;
forcing the hierarchical all-reduce on one host is refused clearly."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from unison.algorithms.select import choose, table
from unison.errors import InvalidArgumentError
from unison.launch.hosts import (
    DEFAULT_RSH,
    allocate,
    forwarded_environment,
    parse_hostfile,
    parse_hosts,
    remote_argv,
    ssh_template,
)
from unison.link import Link, TwoLevelLink, two_level

ROOT = Path(__file__).resolve().parents[2]


def test_parse_hosts() -> None:
    assert parse_hosts("a:4,b:2") == [("a", 4), ("b", 2)]
    assert parse_hosts("a,b:3,a:1") == [("a", 2), ("b", 3)]
    for bad in ("a:x", "a:0", ",", ":2"):
        with pytest.raises(InvalidArgumentError):
            parse_hosts(bad)


def test_parse_hostfile(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\n\nnode2 slots=2 max_slots=8  # gpu\nnode3\n")
    assert parse_hostfile(str(f)) == [("node1", 4), ("node2", 2), ("node3", 1)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(InvalidArgumentError, match="unknown field"):
        parse_hostfile(str(f))
    with pytest.raises(InvalidArgumentError, match="missing"):
        parse_hostfile(str(tmp_path / "missing"))


def test_allocate_fills_hosts_in_order() -> None:
    slots = allocate([("a", 2), ("b", 3), ("c", 4)], 4)
    assert [(s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        ("a", 0, 2, 0, 2),
        ("a", 1, 2, 0, 2),
        ("b", 0, 2, 1, 2),
        ("b", 1, 2, 1, 2),
    ]
    with pytest.raises(InvalidArgumentError, match="more than the 9 slots"):
        allocate([("a", 2), ("b", 3), ("c", 4)], 10)


def test_remote_argv_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/x y")
    wrapper = ["env", "PYTHONPATH=/x y", sys.executable, "-m", "unison.launch.remote"]
    # nothing job-specific (command, environment, secret) is on the command line
    assert remote_argv("ip netns exec {host}", "ns1") == ["ip", "netns", "exec", "ns1", *wrapper]
    out = remote_argv("ssh -p 2222 {host} {command}", "n1")
    assert out[:4] == ["ssh", "-p", "2222", "n1"] and shlex.split(out[4]) == wrapper
    out = remote_argv("/usr/bin/ssh -o BatchMode=yes {host}", "n1")  # ssh: one string
    assert len(out) == 5 and shlex.split(out[4]) == wrapper
    with pytest.raises(InvalidArgumentError, match="host"):
        remote_argv("ssh", "n1")


def test_forwarded_environment_deny_list_and_x() -> None:
    env = {"PATH": "/bin", "HOSTNAME": "a", "SSH_AUTH_SOCK": "/s", "TMPDIR": "/t", "FOO": "1"}
    assert forwarded_environment(env) == {"PATH": "/bin", "FOO": "1"}
    assert forwarded_environment(env, ["TMPDIR"]) == {"PATH": "/bin", "FOO": "1", "TMPDIR": "/t"}


def test_hostfile_host_colon_slots_and_oversubscribe(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("node1:2\nnode2 slots=3\n")
    assert parse_hostfile(str(f)) == [("node1", 2), ("node2", 3)]
    with pytest.raises(InvalidArgumentError, match="--oversubscribe"):
        allocate([("localhost", 2)], 3)
    slots = allocate([("a", 1), ("b", 1)], 5, oversubscribe=True)
    assert [s.host for s in slots] == ["a", "a", "a", "b", "b"]
    assert [(s.local_rank, s.local_size, s.cross_rank) for s in slots][2:4] == [
        (2, 3, 0),
        (0, 2, 1),
    ]


def test_two_level_link_and_choice() -> None:
    flat = Link(40e-6, 1 / 1.5e9)
    assert two_level({0: "a", 1: "a"}, flat, "auto") is None
    link = two_level({0: "a", 1: "a", 2: "b", 3: "b"}, flat, "auto")
    assert isinstance(link, TwoLevelLink) and (link.hosts, link.per_host) == (2, 2)
    uneven = two_level({0: "a", 1: "b", 2: "a", 3: "b"}, flat, "auto")
    assert uneven is not None and uneven.per_host == 0  # not contiguous: flat only
    assert choose("all_reduce", 4, 64 << 20, link, {}).name == "hierarchical"
    assert choose("all_reduce", 4, 64 << 20, uneven, {}).name != "hierarchical"
    assert choose("all_reduce", 2, 64 << 20, link, {}).name != "hierarchical"  # sub-group
    assert "hierarchical=" in table(4, link, [8, 1 << 20])  # every cost() takes it


@pytest.mark.timeout(60)
def test_forced_hierarchical_on_one_host_says_why(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import numpy as np, unison as un\nun.init()\nun.all_reduce(np.ones(8))\n")
    env = dict(os.environ, UNISON_ALGO="all_reduce:hierarchical", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "unison.launch.cli", "run", "-np", "2", sys.executable, str(script)],
        capture_output=True, text=True, env=env, timeout=50,
    )  # fmt: skip
    assert r.returncode != 0
    assert "UnsupportedError" in r.stderr and "needs ranks on more than one host" in r.stderr


def test_ssh_port_and_identity_join_the_default_agent() -> None:
    t = ssh_template(DEFAULT_RSH, 2222, "/keys/my key")
    assert remote_argv(t, "n1")[:8] == [
        "ssh", "-o", "BatchMode=yes", "-p", "2222", "-i", "/keys/my key", "n1",
    ]  # fmt: skip
    assert ssh_template(DEFAULT_RSH, None, None) == DEFAULT_RSH
    with pytest.raises(InvalidArgumentError, match="--rsh"):
        ssh_template("ip netns exec {host}", 22, None)
