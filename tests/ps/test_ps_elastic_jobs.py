"""Elastic parameter-server jobs under ``unison run --servers`` with real processes.

Workers run ``tests/ps/_elastic_train.py``: worker 1 is SIGKILLed mid-step at clock 3,
the others go on and then wait (on a file, not a clock) until the replacement the
launcher starts has joined and pulled. Workers push ``id + 1`` into a ``Sum`` rule, so
every pulled value has an exact oracle. ``localhost`` and ``127.0.0.1`` stand for two
hosts (the failing one is blacklisted by name). That a non-elastic job still fails
fast when a worker dies is test_ps_api.py::test_dead_worker_is_named_and_the_job_ends...
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
# servers: 1; -np 4 = 3 workers + the server; the replacement needs --max-np 4
ELASTIC = ["-np", "4", "--min-np", "3", "--max-np", "4", "--servers", "1"]


def _job(
    tmp: Path, mode: str, *hosts: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "unison.launch.cli", "run", "--timeout", "30", *ELASTIC]
    argv += ["--log-level", "info"]  # the recovery's events are INFO lines
    argv += [*hosts, sys.executable, "-m", "tests.ps._elastic_train", mode, str(tmp), str(STEPS)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=110, cwd=ROOT)


def _lines(out: str, tag: str) -> dict[int, list[list[str]]]:
    by: dict[int, list[list[str]]] = {}
    for line in out.splitlines():
        m = re.search(rf"\b{tag} (\d+) (.*)$", line)
        if m:
            by.setdefault(int(m.group(1)), []).append(m.group(2).split(" ", 1))
    return by


def _contribution(clock: int, bsp: bool) -> float:
    """What the pushes of one clock add: ids 0 and 2 (1 + 3) always, id 1 (2) before the
    kill, at the kill's clock only where pushes apply on arrival (SSP), and from the
    replacement's first clock (5) on."""
    killed = clock < 3 or (clock == 3 and not bsp) or clock >= 5
    return 4.0 + (2.0 if killed else 0.0)


def _state_before(clock: int, bsp: bool) -> float:
    return sum(_contribution(c, bsp) for c in range(clock))


def _check_job(r: subprocess.CompletedProcess[str], bsp: bool, cooldown: str) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr
    assert (
        "unison run: worker lost: worker 1 on host localhost failed (killed by SIGKILL); "
        f"blacklist failing host: localhost ({cooldown})\n" in err
    ), err[-3000:]
    assert "starting worker 1 on host 127.0.0.1 (replaces the lost worker" in err
    assert "worker rank 1 left the job" in err  # the server took its clock out
    assert "worker 1 joined the job at clock 5" in err
    # a handled recovery: INFO lines with names, no tag numbers, one rank prefix per line
    assert "(tag " not in err and "unison[" not in err, err[-3000:]
    assert not [ln for ln in err.splitlines() if " unison." in ln and " INFO:" not in ln], err
    # the replacement kept id 1, started at the slowest live clock (5, the survivors wait
    # there) and its first pull is exactly the servers' state: every push of the clocks
    # before 5, the killed worker's unfinished step dropped under BSP, applied under SSP
    ((joined,),) = _lines(r.stdout, "JOINED").values()
    clock, (workers, value) = joined[0], joined[1].split(" ", 1)
    assert (clock, workers) == ("5", "3"), joined
    assert value == str([_state_before(5, bsp)] * 8), joined
    pulls = _lines(r.stdout, "PULL")
    assert sorted(pulls) == [0, 1, 2], pulls
    killed_and_replacement = [int(c) for c, _ in pulls[1]]
    assert killed_and_replacement == [0, 1, 2, 3, 5, 6, 7], pulls[1]
    for w, seen in pulls.items():
        for c, v in seen:
            if bsp:  # a pull at clock c sees exactly the clocks before c
                assert float(v) == _state_before(int(c), bsp), (w, c, v)
            else:  # SSP(2): at least every clock up to c - 3, at most everything
                assert _state_before(max(0, int(c) - 2), bsp) <= float(v), (w, c, v)
                assert float(v) <= _state_before(STEPS, bsp), (w, c, v)
    final = _lines(r.stdout, "FINAL")
    assert sorted(final) == [0, 1, 2], final
    for (seen,) in final.values():
        assert seen == [str(STEPS), str([_state_before(STEPS, bsp)] * 8)], final


def test_bsp_worker_killed_others_finish_and_the_replacement_rejoins(tmp_path: Path) -> None:
    r = _job(tmp_path, "bsp", "-H", "localhost:3,127.0.0.1:2")
    _check_job(r, bsp=True, cooldown="for good")
    assert "elastic parameter-server job: 3 workers, 1 server (rank 3); 4 ranks" in r.stderr


def test_ssp_job_from_a_discovery_script(tmp_path: Path) -> None:
    # the first replacement dies before it connects: the launcher cancels the servers'
    # wait for it (they would wait out --timeout), and the next replacement joins
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:3\necho 127.0.0.1:2\n")
    script.chmod(0o755)
    r = _job(
        tmp_path,
        "ssp",
        "--host-discovery-script",
        str(script),
        "--blacklist-cooldown-range",
        "1",
        "2",
        env={"PS_TEST_CRASH_JOIN": "1"},
    )
    _check_job(r, bsp=False, cooldown="for 1 s")
    assert re.search(
        r"worker 1 \(join 1\) did not connect: .*the rendezvous was cancelled: "
        r"worker 1 on host 127\.0\.0\.1 failed \(exit code 5\)",
        r.stderr,
    ), r.stderr[-3000:]
    assert r.stderr.count("(replaces the lost worker; it joins the running servers)") == 2


def test_lost_server_ends_the_job_naming_it(tmp_path: Path) -> None:
    r = _job(tmp_path, "killserver", "-H", "localhost:3,127.0.0.1:2")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])
    assert (
        "parameter server 0 (rank 3) on host 127.0.0.1 was lost (killed by SIGKILL); "
        "the job cannot go on without its shards" in r.stderr
    ), r.stderr[-3000:]
    assert "FINAL" not in r.stdout  # the workers were ended (what they see: test_ps_elastic.py)
    # discovery stops listing the server's host: the job ends too
    script = tmp_path / "discover.sh"
    drop = tmp_path / "drop"
    script.write_text(f"#!/bin/sh\necho localhost:3\n[ -e {drop} ] || echo 127.0.0.1:2\n")
    script.chmod(0o755)
    r = _job(tmp_path, "dropserver", "--host-discovery-script", str(script))
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])
    assert (
        "host 127.0.0.1, which runs parameter server 0 (rank 3), was removed by host "
        "discovery; the job cannot go on without its shards" in r.stderr
    ), r.stderr[-3000:]
    assert "FINAL" not in r.stdout and "starting worker" not in r.stderr


def test_discovery_adds_a_slot_and_a_new_worker_joins(tmp_path: Path) -> None:
    # 2 workers + 2 servers, the key split over both; worker 0 makes the script list a
    # 5th slot at clock 2: a new worker (id 2, a new id) joins at the slowest clock, the
    # same on both servers; BSP, ids push id + 1
    script = tmp_path / "discover.sh"
    grow = tmp_path / "grow"
    script.write_text(
        f"#!/bin/sh\nif [ -e {grow} ]; then echo localhost:5; else echo localhost:4; fi\n"
    )
    script.chmod(0o755)
    argv = [sys.executable, "-m", "unison.launch.cli", "run", "--timeout", "30"]
    argv += ["-np", "4", "--min-np", "3", "--max-np", "5", "--servers", "2", "--log-level", "info"]
    argv += ["--host-discovery-script", str(script), sys.executable, "-m"]
    argv += ["tests.ps._elastic_train", "grow", str(tmp_path), str(STEPS)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PS_TEST_SPLIT_BYTES="16")
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=110, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "elastic parameter-server job: 2 workers, 2 servers (ranks 2-3); 4 ranks" in r.stderr
    assert (
        "elastic reset 1: new slots from host discovery; starting worker 2 on host "
        "localhost (a new worker; it joins the running servers)" in r.stderr
    ), r.stderr[-3000:]
    assert r.stderr.count("worker 2 joined the job at clock 5") == 2, r.stderr  # each server
    per_clock = [3.0 * min(c, 5) + 6.0 * max(0, c - 5) for c in range(STEPS + 1)]
    ((joined,),) = _lines(r.stdout, "JOINED").values()
    assert joined == ["5", f"3 {[per_clock[5]] * 8}"], joined  # clock 5, 3 worker ids
    pulls = _lines(r.stdout, "PULL")
    assert sorted(pulls) == [0, 1, 2] and [c for c, _ in pulls[2]] == ["5", "6", "7"], pulls
    for seen in pulls.values():
        for c, v in seen:
            assert float(v) == per_clock[int(c)], (c, v, pulls)
    final = _lines(r.stdout, "FINAL")
    assert {tuple(v[0]) for v in final.values()} == {(str(STEPS), str([per_clock[STEPS]] * 8))}
