"""Issue-6 behaviours with real signals: a rank killed at any moment, stopped, or
sending garbage. Survivors must fail fast with an error naming it; never hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import unison as un
from unison.testing import run_ranks
from unison.testing.faults import parse

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def test_fault_specs_parse_and_reject_nonsense() -> None:
    f = parse("kill@rank=1,op=5; stop@rank=2,op=3,seconds=6")
    assert [(x.kind, x.rank, x.op) for x in f] == [("kill", 1, 5), ("stop", 2, 3)]
    assert f[1].seconds == 6
    for bad in ("explode@rank=1", "kill@op=2", "kill@rank=x"):
        with pytest.raises(un.InvalidArgumentError):
            parse(bad)


def _collectives(n: int) -> float:
    """Run collectives until something fails; return seconds from entering the failing
    op to the error (the detection time)."""
    x = np.ones(n, np.float32)
    for _ in range(10):
        start = time.monotonic()
        try:
            un.all_reduce(x)
            un.broadcast(x, src=0)
        except un.CommunicationError as exc:
            took = time.monotonic() - start
            assert "rank 1" in str(exc), str(exc)
            return took
    raise AssertionError("no failure seen")


@pytest.mark.parametrize("n", [8, 2_000_000])
def test_killed_rank_mid_collective_fails_survivors_within_5s(n: int) -> None:
    outs = run_ranks(
        _collectives,
        4,
        args=(n,),
        timeout=60,
        env={"UNISON_FAULTS": "kill@rank=1,op=3", "UNISON_TIMEOUT": "60"},
    )
    assert outs[1].exitcode == -signal.SIGKILL, outs[1].describe()
    for o in (outs[0], outs[2], outs[3]):
        assert o.ok, o.describe()
        assert o.value < 5.0, o.value


def _p2p_victim() -> float:
    if un.rank() == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        un.recv(np.empty(10), src=1)
    except un.PeerLostError as exc:
        assert "rank 1" in str(exc)
        return time.monotonic() - start - 0.5
    raise AssertionError("recv from a dead rank returned")


def test_killed_rank_mid_p2p() -> None:
    outs = run_ranks(_p2p_victim, 2, timeout=30, env={"UNISON_TIMEOUT": "60"})
    assert outs[0].ok and outs[0].value < 5.0, outs[0].describe()


def _idle_then_use() -> str:
    if un.rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # idle while it dies
    try:
        un.all_reduce(np.ones(4))
    except un.CommunicationError as exc:
        return str(exc)
    raise AssertionError("collective with a dead member succeeded")


def test_rank_dying_while_others_are_idle() -> None:
    outs = run_ranks(_idle_then_use, 3, timeout=30, env={"UNISON_TIMEOUT": "60"})
    for o in outs[:2]:
        assert o.ok and "rank 2" in o.value, o.describe()


def _stopped() -> str:
    for _ in range(3):
        try:
            un.all_reduce(np.ones(16))
        except un.CollectiveTimeoutError as exc:
            return str(exc)
        except un.CommunicationError as exc:
            return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_stopped_rank_is_named_by_the_timeout() -> None:
    outs = run_ranks(
        _stopped,
        3,
        timeout=40,
        env={"UNISON_FAULTS": "stop@rank=1,op=2,seconds=8", "UNISON_TIMEOUT": "2"},
    )
    for o in (outs[0], outs[2]):
        assert o.ok, o.describe()
        assert "all_reduce #2" in o.value and "rank 1 did not answer" in o.value, o.value


def _corrupt() -> str:
    try:
        for _ in range(5):
            un.all_reduce(np.ones(1000))
    except un.CommunicationError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_corrupted_frame_fails_cleanly_naming_the_sender(transport: str) -> None:
    outs = run_ranks(
        _corrupt,
        2,
        timeout=30,
        env={
            "UNISON_FAULTS": "corrupt@rank=1,op=2",
            "UNISON_TIMEOUT": "20",
            "UNISON_TRANSPORT": transport,
            # an algorithm that sends frames (the direct shm ones move data without any)
            "UNISON_ALGO": "all_reduce:ring",
        },
    )
    assert outs[0].ok and "rank 1" in outs[0].value and "bad magic" in outs[0].value, outs[
        0
    ].describe()
    assert outs[1].ok and outs[1].value != "no error", outs[1].describe()


def test_unison_run_ends_the_job_naming_the_killed_rank(tmp_path: Path) -> None:
    script = tmp_path / "victim_job.py"
    script.write_text((ROOT / "examples" / "primitives.py").read_text())
    env = dict(os.environ, UNISON_FAULTS="kill@rank=2,op=3", UNISON_TIMEOUT="60")
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "unison.launch.cli", "run", "-np", "4", sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGKILL, (proc.returncode, err)
    assert "rank 2" in err and "SIGKILL" in err, err
    assert took < 15, took
    # nothing left behind: no rank process, no shared memory of this job (its id holds
    # the launcher's pid)
    leftovers = subprocess.run(
        ["pgrep", "-f", str(script)], capture_output=True, text=True
    ).stdout.split()
    assert not leftovers, leftovers
    mine = (
        [f for f in os.listdir("/dev/shm") if f.startswith("unison-") and f"-{proc.pid}-" in f]
        if os.path.isdir("/dev/shm")
        else []
    )
    assert not mine, mine
