"""Ranks on two namespaced hosts over a shaped veth link: results stay right; cutting
the link makes every rank fail with a clear error within the timeout."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unison.testing.netns import NetnsHosts, netem_available, unavailable

WHY = unavailable()
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"no network namespaces: {WHY}"),
    pytest.mark.timeout(120),
]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys, time
import numpy as np
import unison as un
mode = sys.argv[1]
un.init()
r, p = un.rank(), un.size()
if mode == "correct":
    for n in (0, 1, 1000, 300_000):
        x = np.arange(n, dtype=np.float64) + r
        un.all_reduce(x)
        assert np.array_equal(x, p * np.arange(n) + sum(range(p))), n
        b = np.full(n, r, np.int32)
        un.broadcast(b, src=p - 1)
        assert (b == p - 1).all()
        out = np.empty(n * p, np.int64)
        un.all_gather_into_tensor(out, np.full(n, r, np.int64))
        assert np.array_equal(out, np.repeat(np.arange(p), n))
        a2a = np.empty(p * 3, np.float32)
        un.all_to_all_single(a2a, np.full(p * 3, r, np.float32))
        assert np.array_equal(a2a, np.repeat(np.arange(p, dtype=np.float32), 3))
        un.barrier()
    print("OK", un.local_rank(), un.local_size(), un.cross_rank(), un.cross_size(), flush=True)
else:
    x = np.ones(1000)
    un.all_reduce(x)
    print("READY", flush=True)
    t0 = time.monotonic()
    try:
        while True:
            un.all_reduce(x)
            time.sleep(0.01)
    except un.CommunicationError as e:
        print("ERR", type(e).__name__, f"{time.monotonic() - t0:.1f}", e, flush=True)
"""


@pytest.fixture
def hosts():  # type: ignore[no-untyped-def]
    h = NetnsHosts(2)
    yield h
    h.close()


def _start(hosts: NetnsHosts, mode: str, tmp: Path, timeout: float) -> list[subprocess.Popen[str]]:
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    secret = secrets.token_hex(32)
    port = 29000 + os.getpid() % 1000
    store = subprocess.Popen(
        [
            *hosts.exec_prefix(0),
            sys.executable,
            "-c",
            "import sys; from unison.store import TCPStoreServer; "
            f"s = TCPStoreServer('0.0.0.0', {port}, bytes.fromhex('{secret}')).start(); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    procs = [store]
    for rank in range(4):
        host = rank // 2
        env = dict(
            os.environ,
            UNISON_RANK=str(rank),
            UNISON_SIZE="4",
            UNISON_STORE_ADDR=f"{hosts.host_addr(0)}:{port}",
            UNISON_SECRET=secret,
            UNISON_JOB_ID=f"netns-{port}",
            UNISON_TIMEOUT=str(timeout),
            PYTHONPATH=str(ROOT),
        )
        procs.append(
            subprocess.Popen(
                [*hosts.exec_prefix(host), sys.executable, str(script), mode],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]], limit: float) -> list[tuple[int, str, str]]:
    out = []
    deadline = time.monotonic() + limit
    for p in procs[1:]:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            se += "\n<killed: did not finish>"
        out.append((p.returncode, so, se))
    assert procs[0].stdin is not None
    procs[0].stdin.close()
    procs[0].wait(10)
    return out


@pytest.mark.parametrize("shaping", ["none", "tbf", "netem"])
def test_collectives_across_namespaced_hosts(
    hosts: NetnsHosts, tmp_path: Path, shaping: str
) -> None:
    if shaping == "tbf":
        hosts.shape(1, rate="200mbit")
    if shaping == "netem":
        if not netem_available(hosts):
            pytest.skip("the kernel has no netem qdisc (tc: 'Specified qdisc kind is unknown')")
        hosts.shape(1, delay_ms=5, loss=1.0)
    results = _finish(_start(hosts, "correct", tmp_path, 30), 90)
    for rank, (code, so, se) in enumerate(results):
        assert code == 0 and so.startswith("OK"), (rank, so, se)
        local_rank, local_size, cross_rank, cross_size = map(int, so.split()[1:5])
        assert (local_rank, local_size, cross_rank, cross_size) == (rank % 2, 2, rank // 2, 2)


def test_cut_link_fails_every_rank_within_the_timeout(hosts: NetnsHosts, tmp_path: Path) -> None:
    procs = _start(hosts, "cut", tmp_path, 4)
    for p in procs[1:]:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("READY"), line
    hosts.cut(1)
    cut_at = time.monotonic()
    results = _finish(procs, 40)
    took = time.monotonic() - cut_at
    for rank, (_, so, se) in enumerate(results):
        assert "ERR" in so, (rank, so, se)
        err = so[so.index("ERR") :]
        assert "CollectiveTimeoutError" in err or "PeerLostError" in err or "AbortedError" in err, (
            err
        )
        assert "rank" in err, err
    assert took < 4 + 15, took
