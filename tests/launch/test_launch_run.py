"""``unison run`` with real processes: output, environment, failures, signals, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

CLI = [sys.executable, "-m", "unison.launch.cli"]


def unison(
    *args: str,
    timeout: float = 25,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def script(tmp_path: Path, body: str) -> str:
    """A rank program; ``PIDS`` is a directory where each rank records its pid first."""
    path = tmp_path / "rank.py"
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    path.write_text(
        "import os, sys, time, signal, json\n"
        f"PIDS = {str(pids)!r}\n"
        "RANK = int(os.environ['UNISON_RANK'])\n"
        "SIZE = int(os.environ['UNISON_SIZE'])\n"
        "open(os.path.join(PIDS, str(RANK)), 'w').write(str(os.getpid()))\n"
        "def all_started():\n"
        "    end = time.monotonic() + 20\n"
        "    while len(os.listdir(PIDS)) < SIZE and time.monotonic() < end:\n"
        "        time.sleep(0.01)\n" + textwrap.dedent(body)
    )
    return str(path)


def recorded_pids(tmp_path: Path) -> list[int]:
    return [int((tmp_path / "pids" / name).read_text()) for name in os.listdir(tmp_path / "pids")]


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def assert_all_gone(pids: list[int]) -> None:
    assert pids
    assert wait_until(lambda: not any(alive(p) for p in pids), 5), [p for p in pids if alive(p)]


def test_prefixed_output_from_every_rank(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        print(f"hello from {RANK} of {SIZE}")
        print(f"warning {RANK}", file=sys.stderr)
        sys.stdout.write(f"partial {RANK}")
    """,
    )
    res = unison("run", "-np", "3", sys.executable, prog)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    for r in range(3):
        assert f"[{r}] hello from {r} of 3" in out
        assert f"[{r}] partial {r}" in out
        assert f"[{r}] warning {r}" in res.stderr.splitlines()
    assert all(line.startswith("[") for line in out)


def test_environment_reaches_ranks_and_store_works(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        from unison.store import TCPStore
        host, port = os.environ["UNISON_STORE_ADDR"].rsplit(":", 1)
        store = TCPStore(host, int(port), bytes.fromhex(os.environ["UNISON_SECRET"]), timeout=10)
        store.add("arrived", 1)
        store.set(f"ready/{RANK}", b"1")
        store.wait([f"ready/{r}" for r in range(SIZE)], 10)
        keys = [k for k in os.environ if k.startswith(("UNISON_", "HOROVOD_"))]
        env = {k: os.environ[k] for k in keys + ["PYTHONUNBUFFERED"]}
        env["arrived"] = store.get("arrived").decode()
        print("ENV " + json.dumps(env))
    """,
    )
    res = unison("run", "-np", "3", "--timeout", "7", "--", sys.executable, prog)
    assert res.returncode == 0, res.stderr
    envs = {}
    for line in res.stdout.splitlines():
        tag, _, rest = line.partition(" ENV ")
        if rest:
            envs[int(tag.strip("[]"))] = json.loads(rest)
    assert sorted(envs) == [0, 1, 2]
    secrets_seen = {e["UNISON_SECRET"] for e in envs.values()}
    assert len(secrets_seen) == 1 and len(secrets_seen.pop()) == 64
    for r, e in envs.items():
        assert e["UNISON_RANK"] == e["HOROVOD_RANK"] == str(r)
        assert e["UNISON_SIZE"] == e["HOROVOD_SIZE"] == "3"
        assert e["UNISON_LOCAL_RANK"] == e["HOROVOD_LOCAL_RANK"] == str(r)
        assert e["UNISON_LOCAL_SIZE"] == e["HOROVOD_LOCAL_SIZE"] == "3"
        assert e["UNISON_CROSS_RANK"] == e["HOROVOD_CROSS_RANK"] == "0"
        assert e["UNISON_CROSS_SIZE"] == e["HOROVOD_CROSS_SIZE"] == "1"
        assert e["HOROVOD_HOSTNAME"] == "localhost"
        assert e["UNISON_STORE_ADDR"].startswith("127.0.0.1:")
        assert e["UNISON_TIMEOUT"] == "7.0"
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["UNISON_JOB_ID"] == envs[0]["UNISON_JOB_ID"]
        assert e["arrived"] == "3"


def test_rank_exit_code_fails_job_fast(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        all_started()
        if RANK == 1:
            print("rank one giving up", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """,
    )
    t0 = time.monotonic()
    res = unison("run", "-np", "3", sys.executable, prog)
    assert time.monotonic() - t0 < 10
    assert res.returncode == 3
    assert "unison run: rank 1 failed first (exit code 3): rank one giving up" in res.stderr
    assert res.stderr.count("failed first") == 1
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3
    assert_all_gone(pids)


def test_reason_from_traceback_and_from_store(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        all_started()
        if RANK == 2:
            raise ValueError("boom")
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "3", sys.executable, prog)
    assert res.returncode == 1
    assert "unison run: rank 2 failed first (exit code 1): ValueError: boom" in res.stderr

    prog = script(
        tmp_path,
        """
        from unison.jobenv import FAILURE_KEY, failure_record
        from unison.store import TCPStore
        all_started()
        if RANK == 0:
            host, port = os.environ["UNISON_STORE_ADDR"].rsplit(":", 1)
            s = TCPStore(host, int(port), bytes.fromhex(os.environ["UNISON_SECRET"]))
            s.set(FAILURE_KEY.format(rank=RANK), failure_record("KeyError: 'weights'"))
            print("some unrelated last line", file=sys.stderr)
            sys.exit(4)
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 4
    assert "rank 0 failed first (exit code 4): KeyError: 'weights'" in res.stderr


def test_killed_by_signal_is_reported(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        all_started()
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 128 + signal.SIGKILL
    assert "rank 1 failed first (killed by SIGKILL)" in res.stderr
    assert_all_gone(recorded_pids(tmp_path))


def test_survivor_that_lost_a_peer_is_not_blamed(tmp_path: Path) -> None:
    """The survivor's error (it lost rank 1) exits and is reaped before the rank that was
    killed: the launcher named the survivor (its error carries no failure record)."""
    prog = script(
        tmp_path,
        """
        all_started()
        if RANK == 0:
            print("HorovodInternalError: allreduce.w failed: rank 1 was lost (reset)",
                  file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert "rank 1 failed first (killed by SIGKILL)" in res.stderr, res.stderr
    assert res.returncode == 128 + signal.SIGKILL


def test_setsid_grandchild_does_not_outlive_the_job(tmp_path: Path) -> None:
    """A rank's child that calls setsid() leaves the rank's process group: a group signal
    missed it and it outlived the job (mpirun and torchrun end it)."""
    prog = script(
        tmp_path,
        """
        all_started()
        if os.fork() == 0:
            os.setsid()
            open(os.path.join(PIDS, f"s{RANK}"), "w").write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
        while not os.path.exists(os.path.join(PIDS, f"s{RANK}")):
            time.sleep(0.01)
        if RANK == 1:
            sys.exit(3)
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 3, res.stderr
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4
    try:
        assert_all_gone(pids)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_setsid_grandchild_of_a_finished_job_is_ended(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        all_started()
        if os.fork() == 0:
            os.setsid()
            open(os.path.join(PIDS, f"s{RANK}"), "w").write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
        while not os.path.exists(os.path.join(PIDS, f"s{RANK}")):
            time.sleep(0.01)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 0, res.stderr
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4
    try:
        assert_all_gone(pids)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_later_failures_are_not_blamed(tmp_path: Path) -> None:
    # rank 1 fails first; rank 0 turns our SIGTERM into exit 5 (a consequence, not a cause)
    prog = script(
        tmp_path,
        """
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))
        all_started()
        if RANK == 1:
            sys.exit(2)
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 2, res.stderr
    assert "rank 1 failed first (exit code 2)" in res.stderr


def test_earlier_failure_record_wins(tmp_path: Path) -> None:
    # rank 1's exit is seen first, but rank 0 recorded an earlier failure time
    prog = script(
        tmp_path,
        """
        from unison.jobenv import FAILURE_KEY, failure_record
        from unison.store import TCPStore
        host, port = os.environ["UNISON_STORE_ADDR"].rsplit(":", 1)
        s = TCPStore(host, int(port), bytes.fromhex(os.environ["UNISON_SECRET"]))
        if RANK == 0:
            s.set(FAILURE_KEY.format(rank=0), failure_record("OSError: disk", time.time() - 5))
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(6))
            s.set("rank0-ready", b"1")  # record and handler in place before rank 1 fails
        all_started()
        if RANK == 1:
            s.get("rank0-ready", timeout=20)
            s.set(FAILURE_KEY.format(rank=1), failure_record("PeerLostError: rank 0"))
            sys.exit(1)
        time.sleep(60)
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 6, res.stderr
    assert "rank 0 failed first (exit code 6): OSError: disk" in res.stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_ends_all(tmp_path: Path, signum: int, status: int) -> None:
    prog = script(tmp_path, "time.sleep(60)\n")
    proc = subprocess.Popen(
        [*CLI, "run", "-np", "3", sys.executable, prog],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_until(lambda: len(os.listdir(tmp_path / "pids")) == 3)
    pids = recorded_pids(tmp_path)
    assert all(alive(p) for p in pids)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == status
    assert f"interrupted by {signal.Signals(signum).name}" in err
    assert_all_gone(pids)


def test_launcher_killed_leaves_no_orphans(tmp_path: Path) -> None:
    prog = script(tmp_path, "time.sleep(60)\n")
    proc = subprocess.Popen(
        [*CLI, "run", "-np", "2", sys.executable, prog],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert wait_until(lambda: len(os.listdir(tmp_path / "pids")) == 2)
    pids = recorded_pids(tmp_path)
    proc.kill()
    proc.wait(5)
    assert_all_gone(pids)


def test_grandchildren_do_not_survive(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        """
        import subprocess
        child = subprocess.Popen(["sleep", "60"])
        open(os.path.join(PIDS, f"g{RANK}"), "w").write(str(child.pid))
    """,
    )
    res = unison("run", "-np", "2", sys.executable, prog)
    assert res.returncode == 0
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4
    assert_all_gone(pids)


def test_no_prefix(tmp_path: Path) -> None:
    prog = script(tmp_path, "print(f'plain {RANK}')\n")
    res = unison("run", "--no-prefix", "-np", "2", sys.executable, prog)
    assert res.returncode == 0
    assert sorted(res.stdout.splitlines()) == ["plain 0", "plain 1"]
    env = {**os.environ, "UNISON_PREFIX_OUTPUT": "0"}
    res = unison("run", "-np", "2", sys.executable, prog, env=env)
    assert sorted(res.stdout.splitlines()) == ["plain 0", "plain 1"]


def test_job_timeout(tmp_path: Path) -> None:
    prog = script(tmp_path, "time.sleep(60)\n")
    t0 = time.monotonic()
    res = unison("run", "-np", "2", "--job-timeout", "1", sys.executable, prog)
    assert 0.9 < time.monotonic() - t0 < 10
    assert res.returncode == 124
    assert "job timed out after 1 s" in res.stderr
    assert_all_gone(recorded_pids(tmp_path))


def test_command_not_found_and_usage_errors() -> None:
    res = unison("run", "-np", "2", "no-such-command-xyz")
    assert res.returncode == 127
    assert "no-such-command-xyz" in res.stderr and "not found" in res.stderr
    res = unison("run", "-np", "2")
    assert res.returncode == 2 and "no command" in res.stderr
    res = unison("run", "-np", "0", "true")
    assert res.returncode == 2 and "-np" in res.stderr
    res = unison("run", "-np", "1", "--job-timeout", "-1", "true")
    assert res.returncode == 2 and "--job-timeout" in res.stderr
