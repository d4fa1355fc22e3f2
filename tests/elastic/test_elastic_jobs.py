"""Elastic jobs with real processes on this machine: ``unison run`` in elastic mode with
``tests/elastic/_train.py`` (unison.torch, ``@hvd.elastic.run``, ``TorchState``,
``ElasticSampler``). Two local host names (``localhost`` and ``127.0.0.1``) stand for
two hosts: blacklisting is by name.

Each job checks several things at once: the final world, identical parameters and step
counts on every rank (new ones included), every reset printed with its reason, and
the recovery time (printed: from the first failure a survivor saw to its first
completed step after it — run ``pytest -s`` to see it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(150)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRAIN = HERE / "_train.py"


def _unison(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "unison.launch.cli", "run", "--timeout", "60", *args]
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=140, cwd=tmp)


def _results(r: subprocess.CompletedProcess[str]) -> list[list[str]]:
    out = [
        line.split("RESULT ", 1)[1].split() for line in r.stdout.splitlines() if "RESULT " in line
    ]
    return sorted(out, key=lambda f: int(f[0]))


def _same_model(res: list[list[str]], size: int, rnd: int) -> None:
    assert [f[0] for f in res] == [str(r) for r in range(size)], res
    assert {(f[1], f[2]) for f in res} == {(str(size), str(rnd))}, res
    assert len({f[3] for f in res}) == 1, f"parameters differ: {res}"
    assert len({f[4] for f in res}) == 1, f"step counts differ: {res}"
    first, last = float(res[0][5]), float(res[0][6])
    assert last < first / 20, f"training did not converge: loss {first} -> {last}"


def _epoch0(r: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    """(samples, distinct samples) of epoch 0 trained on by the job, across resets."""
    line = next(x for x in r.stdout.splitlines() if "EPOCH0 " in x)
    n, distinct = line.split("EPOCH0 ", 1)[1].split()
    return int(n), int(distinct)


def _recovery(r: subprocess.CompletedProcess[str]) -> list[float]:
    times = [float(line.split()[-1]) for line in r.stdout.splitlines() if "RECOVERY" in line]
    for t in times:
        print(f"\nelastic recovery: {t:.3f} s from the failure to the first completed step")
    return times


def test_host_loss_shrinks_the_world_and_training_finishes(tmp_path: Path) -> None:
    # the first host (ranks 0 and 1) is lost: the other host's workers become ranks 0, 1
    r = _unison(
        tmp_path,
        "-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2",
        "-x", "ELASTIC_TEST_DIE=localhost[0],localhost[1]@5",
        sys.executable, str(TRAIN),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    _same_model(_results(r), 2, 1)
    err = r.stderr
    assert "elastic job: initial world; world 0: 4 ranks (localhost:2, 127.0.0.1:2)" in err
    lost = r"rank ([01]) \(worker localhost\[\1\]\) on host localhost failed"
    lost_line = f"unison run: worker lost: {lost} .killed by SIGKILL.; "
    assert re.search(lost_line + r"blacklist failing host: localhost \(for good\)\n", err), err
    assert re.search(f"elastic reset 1: {lost} .killed by SIGKILL.; world 1: 2 ranks", err)
    assert "world 1: 2 ranks (127.0.0.1:2)" in err and "elastic reset 2" not in err
    # output lines are prefixed with the rank in the newest world (workers 2, 3 -> 0, 1)
    assert "[0] RESULT 0 2 1 " in r.stdout and "[1] RESULT 1 2 1 " in r.stdout, r.stdout
    # ElasticSampler: epoch 0, cut at step 5 by the loss, neither repeats nor skips a sample
    assert _epoch0(r) == (192, 192), r.stdout
    assert "collective failed, restoring the last commit" in err
    assert re.search(f"joined round 1 .{lost}", err)  # workers log the reason too
    assert "RESET rank=0 size=2 round=1" in r.stdout and "RESET rank=1 size=2" in r.stdout
    assert "OLDGROUP barrier refused: group 3 is unusable" in r.stdout, r.stdout
    assert "it belongs to elastic round 0 that was shut down" in r.stdout
    assert len(_recovery(r)) >= 1


def test_discovery_script_grows_the_world(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover_hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    r = _unison(
        tmp_path,
        "-np", "2", "--min-np", "2", "--max-np", "3",
        "--host-discovery-script", str(script),
        "-x", f"ELASTIC_TEST_GROW={hosts}@3", "-x", "ELASTIC_TEST_GROW_LINE=127.0.0.1:4",
        "-x", "ELASTIC_TEST_UNTIL_SIZE=3", "-x", "ELASTIC_TEST_EPOCHS=1",
        sys.executable, str(TRAIN),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    _same_model(_results(r), 3, 1)  # the new rank holds the same parameters and step
    err = r.stderr
    assert "elastic reset 1: new slots from host discovery; world 1: 3 ranks " in err, err
    assert "(localhost:2, 127.0.0.1:1)" in err  # --max-np 3 caps the 4 new slots at 1
    assert err.count("hosts updated, re-forming the world at this commit") == 2, err
    assert "RESET rank=0 size=3 round=1" in r.stdout


def test_member_lost_during_rendezvous_is_left_behind(tmp_path: Path) -> None:
    # the world grows by a worker that dies while the others wait for it in the new
    # world's rendezvous: the driver cancels that rendezvous and re-forms without it
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    r = _unison(
        tmp_path,
        "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", f"cat {hosts}",
        "-x", f"ELASTIC_TEST_GROW={hosts}@3", "-x", "ELASTIC_TEST_GROW_LINE=127.0.0.1:1",
        "-x", "ELASTIC_TEST_DIE_IN_INIT=127.0.0.1[2]", "-x", "ELASTIC_TEST_DIE_IN_INIT_WAITING=2",
        "-x", "ELASTIC_TEST_UNTIL_ROUND=2", "-x", "ELASTIC_TEST_EPOCHS=1",
        sys.executable, str(TRAIN),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    _same_model(_results(r), 2, 2)
    err = r.stderr
    assert "elastic reset 1: new slots from host discovery; world 1: 3 ranks" in err, err
    lost = "rank 2 (worker 127.0.0.1[2]) on host 127.0.0.1 failed (killed by SIGKILL)"
    assert f"worker lost: {lost}; blacklist failing host: 127.0.0.1 (for good)\n" in err
    assert f"elastic reset 2: {lost}; world 2: 2 ranks (localhost:2)" in err
    # both survivors stopped waiting because the rendezvous was cancelled, not timed out
    cancelled = "world 1 did not form (init: rank {}: the rendezvous was cancelled: "
    cancelled += f"superseded by world 2: {lost})"
    assert cancelled.format(0) in err and cancelled.format(1) in err, err


def test_failing_host_is_blacklisted_then_returns_after_cooldown(tmp_path: Path) -> None:
    # host 127.0.0.1 keeps failing: its first worker dies at step 3, the one started
    # after the first cool-down dies after 2 steps; the cool-down doubles (1 s, 2 s) and
    # the third worker there stays: worlds 2, 1, 2, 1, 2 ranks (rounds 0..4)
    r = _unison(
        tmp_path,
        "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1",
        "--blacklist-cooldown-range", "1", "4", "--reset-limit", "4",
        "-x", "ELASTIC_TEST_DIE=127.0.0.1[1]@3", "-x", "ELASTIC_TEST_DIE_AFTER=127.0.0.1[2]@2",
        "-x", "ELASTIC_TEST_UNTIL_ROUND=4", "-x", "ELASTIC_TEST_EPOCHS=1",
        sys.executable, str(TRAIN),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    _same_model(_results(r), 2, 4)
    err = r.stderr
    for worker, cooldown in (("127.0.0.1[1]", 1), ("127.0.0.1[2]", 2)):
        lost = f"rank 1 (worker {worker}) on host 127.0.0.1 failed (killed by SIGKILL)"
        blacklist = f"blacklist failing host: 127.0.0.1 (for {cooldown} s)"
        assert f"unison run: worker lost: {lost}; {blacklist}\n" in err, err
    assert "world 1: 1 ranks (localhost:1)" in err and "world 3: 1 ranks (localhost:1)" in err
    assert "elastic reset 2: new slots from host discovery; world 2: 2 ranks " in err
    assert "elastic reset 4: new slots from host discovery; world 4: 2 ranks " in err
    assert "[1] RESULT 1 2 4 " in r.stdout, r.stdout  # worker 127.0.0.1[3], started as rank 1
    _recovery(r)


def test_below_min_np_waits_for_the_elastic_timeout_then_fails(tmp_path: Path) -> None:
    r = _unison(
        tmp_path,
        "-np", "2", "--min-np", "2", "-H", "localhost:1,127.0.0.1:1", "--elastic-timeout", "2",
        "-x", "ELASTIC_TEST_DIE=127.0.0.1[1]@3",
        sys.executable, str(TRAIN),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr[-4000:]
    err = r.stderr
    assert "waiting up to 2 s for 2 slots (--min-np), 1 available" in err, err
    assert "Timed out waiting for minimum number of slots to become available" in err
    assert "at least 2 processes (--min-np 2; 1 available after 2 s" in err
    assert "RESULT" not in r.stdout


def test_bad_elastic_arguments_are_refused(tmp_path: Path) -> None:
    r = _unison(tmp_path, "-np", "2", "--min-np", "3", "true")
    assert r.returncode == 2 and "--min-np (3) <= -np (2)" in r.stderr, r.stderr
    r = _unison(tmp_path, "-np", "2", "--host-discovery-script", "exit 4", "true")
    assert r.returncode == 1 and "Failed to execute discovery script: exit 4" in r.stderr
    r = _unison(tmp_path, "-H", "a:1", "--host-discovery-script", "true", "--min-np", "1", "true")
    assert r.returncode == 2 and "either -H/--hostfile or --host-discovery-script" in r.stderr
    r = _unison(tmp_path, "-np", "3", "--min-np", "1", "--servers", "1", "true")
    assert r.returncode == 2 and "--min-np must leave at least one worker" in r.stderr


def test_job_timeout_and_clean_exit_without_unison(tmp_path: Path) -> None:
    # a command that never joins the job: the elastic launcher still supervises it
    r = _unison(tmp_path, "-np", "1", "--min-np", "1", "--job-timeout", "1", "sleep", "30")
    assert r.returncode == 124 and "job timed out after 1 s" in r.stderr, r.stderr
    r = _unison(tmp_path, "-np", "2", "--min-np", "1", sys.executable, "-c", "print('hi')")
    assert r.returncode == 0 and r.stdout.count("hi") == 2, (r.stdout, r.stderr)
    assert "world 0: 2 ranks (localhost:2)" in r.stderr


_WAIT_FOR_ROUND_1 = """
import os, sys, time
from unison.elastic import worker
if os.environ["UNISON_ELASTIC_ID"].startswith("127."):
    time.sleep(60)  # ended by the launcher when its host leaves the list
    sys.exit(5)
with open(sys.argv[1], "w") as f:
    f.write("localhost:1\\n")  # the other host disappears from the discovery output
w, end = worker(), time.monotonic() + 60
while w.latest() < 1 and time.monotonic() < end:
    time.sleep(0.1)
print("round", w.latest())
"""


_SHRINK_BELOW_MIN = """
import os, sys, time
if os.environ["UNISON_ELASTIC_ID"] == "localhost[0]":
    with open(sys.argv[1], "w") as f:
        f.write("localhost:1\\n")  # the host now lists one slot of its two
time.sleep(60)  # the job must end: 1 slot is below --min-np 2
"""


def test_host_whose_slots_shrink_below_min_np_ends_the_job(tmp_path: Path) -> None:
    """A host listing fewer slots kept all its workers (the world re-formed as before and
    trained on below --min-np); as Horovod, its extra workers go and the job waits
    --elastic-timeout for the minimum, then ends."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    code = tmp_path / "w.py"
    code.write_text(_SHRINK_BELOW_MIN)
    r = _unison(
        tmp_path, "-np", "2", "--min-np", "2", "--max-np", "2", "--elastic-timeout", "2",
        "--host-discovery-script", f"cat {hosts}", sys.executable, str(code), str(hosts),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "slots removed by discovery: localhost now 1" in r.stderr, r.stderr
    assert "Timed out waiting for minimum number of slots to become available" in r.stderr
    assert "--min-np 2; 1 available after 2 s" in r.stderr, r.stderr


def test_removed_host_and_reset_limit(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    code = tmp_path / "w.py"
    code.write_text(_WAIT_FOR_ROUND_1)
    r = _unison(
        tmp_path, "-np", "2", "--min-np", "1", "--host-discovery-script", f"cat {hosts}",
        sys.executable, str(code), str(hosts),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "round 1" in r.stdout
    assert "elastic reset 1: hosts removed by discovery: 127.0.0.1; world 1: 1 ranks" in r.stderr
    assert "blacklist" not in r.stderr  # ended by the launcher: not a failure
    # one failure is one reset too many with --reset-limit 0
    die = "import os,sys,time; os.environ['UNISON_ELASTIC_ID'][0]=='1' and sys.exit(3)\n"
    die += "time.sleep(60)"
    r = _unison(
        tmp_path, "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1",
        "--reset-limit", "0", sys.executable, "-c", die,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert (
        "reset limit 0 exceeded (rank 1 (worker 127.0.0.1[1]) on host 127.0.0.1 failed" in r.stderr
    )
