"""Typed errors on every engine (issue 12, items 11 and 12).

- A launcher world that disagrees with the engine's world is refused at init, saying
  how to launch (it used to run each process alone and return wrong sums, exit 0).
- Ranks that disagree on an operation get MismatchError on every rank before the
  engine is called (Gloo used to abort the process, MPI to fail on one rank only),
  and the group stays usable; a group left in an unknown state by a timeout refuses
  later calls with a clear error instead of running them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import unison as un
from unison.backends.base import check_launch
from unison.errors import LaunchError
from unison.testing import run_ranks

from .test_backends import HERE, _mpi_command, needs_mpi

pytestmark = pytest.mark.timeout(120)
ROOT = HERE.parent.parent


def test_check_launch_names_the_launcher() -> None:
    check_launch("mpi", 0, 2, {"UNISON_SIZE": "2"})  # agreeing worlds pass
    check_launch("mpi", 0, 1, {})  # no launcher world: nothing to compare
    with pytest.raises(LaunchError, match=r"mpirun -np 2") as exc:
        check_launch("mpi", 0, 1, {"UNISON_SIZE": "2"})
    assert "UNISON_SIZE=2" in str(exc.value) and "world of 1" in str(exc.value)
    with pytest.raises(LaunchError, match=r"torchrun --nproc-per-node 4"):
        check_launch("torch", 0, 1, {"HOROVOD_SIZE": "4"})


@needs_mpi
@pytest.mark.timeout(90)
def test_mpi_backend_under_unison_run_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "mpi_under_run.py"
    script.write_text(
        "import sys, numpy as np, unison as un\n"
        "try:\n"
        "    un.init(backend='mpi')\n"
        "finally:\n"
        "    print('MPI started:', 'mpi4py.MPI' in sys.modules, flush=True)\n"
        "a = np.array([un.rank() + 1.0])\n"
        "un.all_reduce(a)\n"
        "print('SUM', a[0], flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "OMPI_", "PMIX"))}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "unison.launch.cli", "run", "-np", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=80,
        cwd=ROOT,
        env=env,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "SUM" not in text, text  # nothing ran on the wrong world
    assert "LaunchError" in text and "mpirun -np 2" in text, text
    # refused before MPI starts: a singleton MPI world leaves Open MPI's /dev/shm file
    assert "MPI started: False" in text and "MPI started: True" not in text, text


def _mismatches(fresh_groups: bool) -> list[str]:
    """Each disagreement raises MismatchError on every rank. On external engines nothing
    ran, so the same group stays usable; the native engine finds it in the frames (the
    operation had started) and retires the group, so each case gets its own there."""
    r = un.rank()
    seen = []
    world = un.get_world_group()
    cases = [
        ("count", lambda g: un.all_reduce(np.ones(4 + 4 * r, np.float32), group=g)),
        ("dtype", lambda g: un.all_reduce(np.ones(4, np.float32 if r else np.float64), group=g)),
        ("op", lambda g: un.all_reduce(np.ones(4), un.ReduceOp.MAX if r else un.ReduceOp.SUM, g)),
        ("root", lambda g: un.broadcast(np.ones(4), src=r, group=g)),
        (
            "kind",
            lambda g: un.all_reduce(np.ones(4), group=g) if r else un.broadcast(np.ones(4), 0, g),
        ),
    ]
    for what, call in cases:
        g = un.new_group([0, 1]) if fresh_groups else world
        try:
            call(g)
        except un.MismatchError as exc:
            assert "mismatch" in str(exc) and "called" in str(exc), str(exc)
            seen.append(what)
    a = np.array([r + 1.0])
    un.all_reduce(a)  # the world still works
    assert a[0] == 3.0, a
    return seen


def _timeout_then_refused() -> str:
    g = un.new_group([0, 1])
    if un.rank() == 1:
        import time

        time.sleep(6)  # never joins; rank 0 gives up after UNISON_TIMEOUT
        return "skipped"
    try:
        un.all_reduce(np.ones(4), group=g)
    except un.CollectiveTimeoutError:
        pass
    else:
        raise AssertionError("no timeout")
    try:
        un.all_reduce(np.ones(4), group=g)
    except un.AbortedError as exc:
        return str(exc)
    raise AssertionError("a group in an unknown state ran another operation")


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_mismatch_raises_on_every_rank(backend: str) -> None:
    env = {"UNISON_BACKEND": backend, "UNISON_TIMEOUT": "20"}
    outs = run_ranks(_mismatches, 2, args=(backend == "native",), env=env, timeout=60)
    for o in outs:
        assert o.ok, o.traceback
        assert o.value == ["count", "dtype", "op", "root", "kind"], o.value


@pytest.mark.timeout(60)
def test_torch_group_refuses_after_timeout() -> None:
    outs = run_ranks(
        _timeout_then_refused, 2, env={"UNISON_BACKEND": "torch", "UNISON_TIMEOUT": "2"}, timeout=40
    )
    assert outs[0].ok, outs[0].traceback
    assert "unusable since an earlier failure" in outs[0].value, outs[0].value


def _one_rank_killed() -> str:
    import signal

    x = np.ones(1 << 14, np.float32)
    try:
        for step in range(200):
            if step == 10 and un.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            un.all_reduce(x)
    except un.PeerLostError as exc:
        # stay a moment: a survivor that already left would be a lost process too to
        # a slower one (the engine names the local ranks whose process has ended)
        time.sleep(3.0)
        return str(exc)
    raise AssertionError("no PeerLostError")


@pytest.mark.timeout(90)
def test_torch_engine_names_the_killed_rank_on_every_survivor() -> None:
    """Gloo reports a closed connection (an address); the survivors' error named no rank."""
    env = {"UNISON_BACKEND": "torch", "UNISON_TIMEOUT": "20"}
    outs = run_ranks(_one_rank_killed, 3, env=env, timeout=70)
    assert not outs[1].ok and outs[1].exitcode == -9
    for o in (outs[0], outs[2]):
        assert o.ok, o.describe()
        assert "rank 1 was lost" in o.value, o.value


@needs_mpi
@pytest.mark.timeout(90)
def test_mpi_mismatch_and_refusal() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        _mpi_command(2, HERE / "mpi_errors.py"), env=env, capture_output=True, text=True, timeout=80
    )
    out = proc.stdout
    for r in (0, 1):
        assert f"rank {r} MismatchError: all_reduce (group 0, mpi): mismatch" in out, out
        assert f"rank {r} usable after mismatch: 3.0" in out, out
    assert "rank 0 AbortedError: all_reduce refused: group 1 is unusable" in out, out


@needs_mpi
@pytest.mark.timeout(90)
def test_mpi_rank_killed_ends_the_job_naming_the_rank() -> None:
    """The mpi engine's "rank killed" case. OpenMPI's default on a lost process is to
    abort the job: mpirun ends the survivors and exits nonzero naming the rank, before
    any survivor's deadline (5 s) can raise. Checked: that exit and its message, no
    survivor that completed as if nothing happened, and no process left behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(ROOT)
    env["KILL_TIMEOUT"] = "5"
    start = time.monotonic()
    proc = subprocess.run(
        _mpi_command(3, HERE / "mpi_killed.py"), env=env, capture_output=True, text=True, timeout=80
    )
    elapsed = time.monotonic() - start
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert re.search(r"process rank 1 with PID \d+ .*exited on\s+signal 9", text, re.S), text
    assert "no error" not in proc.stdout, text
    for line in proc.stdout.splitlines():  # a survivor that reported: typed, naming rank 1
        if line.startswith(("rank 0 ", "rank 2 ")) and " pid " not in line:
            assert "PeerLostError" in line and "rank 1" in line, line
    assert elapsed < 60, elapsed
    pids = [int(p) for p in re.findall(r"^rank \d pid (\d+)$", proc.stdout, re.M)]
    assert len(pids) == 3, proc.stdout
    time.sleep(0.5)
    left = [p for p in pids if _alive(p)]
    assert not left, f"processes left behind: {left}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone but for its parent's wait
        return f.read().split(")")[-1].split()[0] != "Z"
