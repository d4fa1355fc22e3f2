"""``unison run -H ... --rsh 'ip netns exec {host}'`` on namespaced hosts (one switch,
the launcher's namespace on it): every collective right across 2 and 3 hosts, flat and
hierarchical; remote failures named with host and status; Ctrl-C and a failure end
ranks on every host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from unison.testing.netns import unavailable

from .bridged import IFACE, BridgedHosts
from .output import read_until

WHY = unavailable()
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"no network namespaces: {WHY}"),
    pytest.mark.timeout(120),
]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, sys, time
import numpy as np
import unison as un
from unison.world import current
un.init()
r, p = un.rank(), un.size()
mode = sys.argv[1]
if mode == "fail":
    un.barrier()
    if r == p - 1:
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), 9)
        sys.exit(3)
    time.sleep(60)
    sys.exit(0)
if mode == "hang":
    un.barrier()
    print("READY", flush=True)
    time.sleep(60)
    sys.exit(0)
want = os.environ.get("UNISON_ALGO", "all_reduce:hierarchical").split(":")[1]
assert current().choose("all_reduce", p, 1 << 20).name == want
rng = np.random.default_rng(7)
for n in (0, 1, 5, 1000, 100_003):
    base = rng.integers(-50, 50, size=(p, n))
    for dt in (np.float64, np.int32, np.float32):
        x = base[r].astype(dt)
        un.all_reduce(x)
        assert np.array_equal(x, base.sum(0).astype(dt)), ("sum", n, dt)
    x = base[r].astype(np.int64)
    un.all_reduce(x, op=un.ReduceOp.MIN)
    assert np.array_equal(x, base.min(0)), ("min", n)
    x = base[r].astype(np.float64)
    un.all_reduce(x, op=un.ReduceOp.AVG)
    assert np.allclose(x, base.mean(0)), ("avg", n)
    b = base[r].astype(np.float32) if r == 1 else np.zeros(n, np.float32)
    un.broadcast(b, src=1)
    assert np.array_equal(b, base[1].astype(np.float32)), ("bcast", n)
    out = np.empty(n * p, np.int64)
    un.all_gather_into_tensor(out, base[r])
    assert np.array_equal(out, base.reshape(-1)), ("all_gather", n)
    full = rng.integers(-9, 9, size=(p, n * p))
    rs = np.empty(n, np.int64)
    un.reduce_scatter_tensor(rs, full[r].copy())
    assert np.array_equal(rs, full.sum(0)[r * n : (r + 1) * n]), ("reduce_scatter", n)
    a2a = np.empty(p * 3, np.float32)
    un.all_to_all_single(a2a, np.full(p * 3, r, np.float32))
    assert np.array_equal(a2a, np.repeat(np.arange(p, dtype=np.float32), 3)), "a2a"
    un.barrier()
sub = un.new_group(list(range(0, p, 2)))
if r % 2 == 0:
    y = np.full(10, r, np.int64)
    un.all_reduce(y, group=sub)
    assert (y == sum(range(0, p, 2))).all()
print("OK", un.local_rank(), un.local_size(), un.cross_rank(), un.cross_size(), flush=True)
if r != 0:  # rank 0 leaves first, with no shutdown(): the others must not log its goodbye
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def two() -> Iterator[BridgedHosts]:
    h = BridgedHosts(2)
    yield h
    h.close()


@pytest.fixture(scope="module")
def three() -> Iterator[BridgedHosts]:
    h = BridgedHosts(3)
    yield h
    h.close()


def _argv(hosts: BridgedHosts, per: int, script: Path, *args: str) -> list[str]:
    spec = ",".join(f"{n}:{per}" for n in hosts.names)
    return [
        sys.executable, "-m", "unison.launch.cli", "run",
        "-np", str(per * len(hosts.names)), "-H", spec,
        "--rsh", "ip netns exec {host}", "--store-addr", hosts.launcher_addr,
        "--network-interface", IFACE, "--timeout", "30",
        sys.executable, str(script), *args,
    ]  # fmt: skip


def _run(
    hosts: BridgedHosts, per: int, tmp: Path, *args: str, algo: str = ""
) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if algo:
        env["UNISON_ALGO"] = algo
    return subprocess.run(
        _argv(hosts, per, script, *args), capture_output=True, text=True, env=env, timeout=100
    )


def _check_ok(r: subprocess.CompletedProcess[str], hosts: int, per: int) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]  # an orderly shutdown logs nothing
    lines = sorted(line for line in r.stdout.splitlines() if " OK " in line)
    assert len(lines) == hosts * per, r.stdout
    for line in lines:
        rank = int(line[1 : line.index("]")])
        assert line.split()[2:] == list(map(str, (rank % per, per, rank // per, hosts))), line


@pytest.mark.parametrize("algo", ["all_reduce:hierarchical", "all_reduce:ring"])
def test_every_collective_on_two_hosts(two: BridgedHosts, tmp_path: Path, algo: str) -> None:
    _check_ok(_run(two, 2, tmp_path, "correct", algo=algo), 2, 2)


def test_every_collective_on_three_shaped_hosts(three: BridgedHosts, tmp_path: Path) -> None:
    three.shape("500mbit")
    _check_ok(_run(three, 2, tmp_path, "correct"), 3, 2)


def test_selector_picks_hierarchical_by_itself(two: BridgedHosts, tmp_path: Path) -> None:
    script = tmp_path / "pick.py"
    script.write_text(
        "import unison as un\nfrom unison.world import current\nun.init()\n"
        "print('PICK', current().choose('all_reduce', un.size(), 1 << 22).name)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(_argv(two, 2, script), capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("PICK hierarchical") == 4, out.stdout


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_remote_failure_names_host_and_ends_every_host(
    two: BridgedHosts, tmp_path: Path, how: str
) -> None:
    t0 = time.monotonic()
    r = _run(two, 2, tmp_path, "fail", how)
    took = time.monotonic() - t0
    status = "exit code 3" if how == "exit" else "killed by SIGKILL"
    assert f"rank 3 on host {two.names[1]} failed first ({status})" in r.stderr, r.stderr
    assert r.returncode == (3 if how == "exit" else 128 + 9)
    assert took < 40, took  # the others sleep 60 s: the launcher ended them
    for name in two.names:
        assert _pids(name) == [], name


def _pids(netns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return out.stdout.split()


def test_ctrl_c_ends_ranks_on_every_host(two: BridgedHosts, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        _argv(two, 2, script, "hang"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    head, ready = read_until(proc, lambda text: text.count("READY") >= 4, 120)
    assert ready, head
    assert all(_pids(n) for n in two.names)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err
    for name in two.names:
        assert _pids(name) == [], name


def test_bench_runs_across_hosts(two: BridgedHosts, tmp_path: Path) -> None:
    """unison, Gloo and (where installed) Open MPI measured across the same two hosts in
    one run, every row checked; Open MPI's daemons started in the hosts' namespaces."""
    from unison.bench.cli import missing

    if missing("gloo") is not None:
        pytest.skip(f"Gloo peer: {missing('gloo')}")
    peers = ["gloo"] + (["mpi"] if missing("mpi") is None else [])
    out = tmp_path / "bench.json"
    spec = ",".join(f"{n}:2" for n in two.names)
    agent = two.mpi_agent(str(tmp_path / "agent.sh"))
    r = subprocess.run(
        [sys.executable, "-m", "unison.launch.cli", "bench", "-np", "4", "-H", spec,
         "--rsh", "ip netns exec {host}", "--store-addr", two.launcher_addr,
         "--network-interface", IFACE, "--sizes", "1K,64K", "--iters", "5",
         "--compare", ",".join(peers), "--json", str(out),
         "--mpi-mca", f"plm_ssh_agent={agent}",
         "--mpi-mca", f"btl_tcp_if_include={two.subnet}",
         "--mpi-mca", f"oob_tcp_if_include={two.subnet}"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=100,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    data = json.loads(out.read_text())
    for impl in ("unison", *peers):  # every implementation across the same hosts, checked
        rows = [row for row in data["rows"] if row["impl"] == impl]
        assert {row["size"] for row in rows} == {1024, 65536}, (impl, data)
        assert all(row["correct"] is True and row["np"] == 4 for row in rows), rows
    assert not data["meta"]["skipped"], data["meta"]
    if "mpi" in peers:  # mpirun put ranks on both hosts (the agent names each host)
        assert all(r["hostnames"] == 2 for r in data["rows"] if r["impl"] == "mpi"), data
