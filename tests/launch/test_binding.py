"""mpirun's habit in ``unison run``: each rank of a host bound to its own share of the
host's cores (``UNISON_BIND``, ``--bind-to``), on this host and on hosts reached over the
remote shell, and the rank still counting the host's cores when it asks whether its host's
ranks outnumber them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison import config as C
from unison import jobenv
from unison.launch.rankenv import THREAD_VARIABLES, binding_of, cpu_share, usable_cpus

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "unison", "run"]
SHOW = (
    "import json, os\n"
    "from unison import jobenv\n"
    "print('RANK ' + json.dumps({'rank': int(os.environ['UNISON_RANK']),"
    " 'host': os.environ.get('HOROVOD_HOSTNAME'),"
    " 'cpus': sorted(os.sched_getaffinity(0)), 'env': os.environ.get('UNISON_CPUS'),"
    " 'host_cores': jobenv.host_cores()}), flush=True)\n"
)
FAKE_RSH = ["--rsh", "env UNISON_TEST_HOST={host}", "--store-addr", "127.0.0.1"]
two_cores = pytest.mark.skipif(len(usable_cpus()) < 2, reason="needs 2 usable cores")


def _run(*argv: str, cpus: list[int] | None = None) -> list[dict]:
    """The ranks' reports of ``unison run ARGV``, and its stderr; ``cpus``: the cores the
    launcher itself may use."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith(("UNISON_", "HOROVOD_"))}
    r = subprocess.run(
        [*CLI, *argv, sys.executable, "-c", SHOW],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        timeout=100,
        cwd=ROOT,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    assert r.returncode == 0, r.stderr
    out = [json.loads(ln.split("RANK ", 1)[1]) for ln in r.stdout.splitlines() if "RANK " in ln]
    return [*sorted(out, key=lambda d: d["rank"]), {"stderr": r.stderr}]


def test_each_rank_gets_its_own_run_of_the_cores() -> None:
    eight = list(range(8))
    assert [cpu_share({}, r, 2, eight) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [cpu_share({}, r, 3, eight) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert cpu_share({}, 1, 2, [2, 5]) == [5]  # the usable cores, whichever they are
    assert cpu_share({}, 0, 1, eight) is None  # one rank has the host
    # more ranks than cores: one core each, neighbours in rank order on the same core
    assert [cpu_share({}, r, 4, [0, 1]) for r in range(4)] == [[0], [0], [1], [1]]
    assert [cpu_share({}, r, 3, [0, 1]) for r in range(3)] == [[0], [0], [1]]
    assert cpu_share({"UNISON_BIND": "none"}, 0, 2, eight) is None
    # the user's thread count: their threads, their placement; unless they ask
    assert cpu_share({"OMP_NUM_THREADS": "3"}, 0, 2, eight) is None
    assert cpu_share({"OMP_NUM_THREADS": "3", "UNISON_BIND": "core"}, 1, 2, eight) == [4, 5, 6, 7]
    assert binding_of({C.ENV_CPUS: "4,5"}) == [4, 5]
    assert binding_of({C.ENV_CPUS: "x"}) is None and binding_of({}) is None


def test_host_cores_is_the_launchers_count_for_a_bound_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(C.ENV_CPUS, raising=False)
    monkeypatch.setenv(C.ENV_HOST_CORES, "64")
    assert jobenv.host_cores() == jobenv.usable_cores()  # not bound by unison run
    monkeypatch.setenv(C.ENV_CPUS, "0")
    assert jobenv.host_cores() == 64


@two_cores
def test_ranks_run_on_disjoint_shares_and_say_so() -> None:
    *ranks, info = _run("-np", "2")
    usable = usable_cpus()
    k = len(usable) // 2
    assert [r["cpus"] for r in ranks] == [usable[:k], usable[k : 2 * k]], ranks
    for r in ranks:
        assert r["env"] == ",".join(map(str, r["cpus"]))
        assert r["host_cores"] == len(usable)  # the host's, not the rank's own share
    notice = [ln for ln in info["stderr"].splitlines() if "ranks share this host's" in ln]
    assert len(notice) == 1 and "on its own" in notice[0] and "--bind-to none" in notice[0]


@two_cores
@pytest.mark.parametrize(
    "argv",
    [["--bind-to", "none"], ["-x", "UNISON_BIND=none"], ["-x", "OMP_NUM_THREADS=1"]],
    ids=["bind-to-none", "variable", "user-threads"],
)
def test_unbound_when_asked_or_when_the_user_placed_the_threads(argv: list[str]) -> None:
    *ranks, info = _run("-np", "2", *argv)
    assert len(ranks) == 2
    for r in ranks:
        assert r["cpus"] == usable_cpus() and r["env"] is None, r
    assert "on its own" not in info["stderr"]


@two_cores
def test_bind_to_core_binds_despite_the_users_thread_count() -> None:
    *ranks, _ = _run("-np", "2", "--bind-to", "core", "-x", "OMP_NUM_THREADS=1")
    assert len({tuple(r["cpus"]) for r in ranks}) == 2 and all(r["env"] for r in ranks)


@two_cores
def test_ranks_that_outnumber_the_cores_take_turns_on_one_core_each() -> None:
    usable = usable_cpus()[:2]  # a launcher on two cores, whatever this machine has
    n = 2 * len(usable)
    *ranks, _ = _run("-np", str(n), cpus=usable)
    assert [r["cpus"] for r in ranks] == [[usable[i // 2]] for i in range(n)], ranks
    assert all(r["host_cores"] == len(usable) for r in ranks)  # they still outnumber them


@two_cores
def test_ranks_on_a_remote_host_are_bound_there() -> None:
    """The host reached over the remote shell divides its own cores (the wrapper there
    binds); the host with one rank leaves it unbound."""
    *ranks, _ = _run("-np", "3", "-H", "localhost:1,fakehost:2", *FAKE_RSH)
    by_host: dict[str, list[dict]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r)
    assert [r["cpus"] for r in by_host["localhost"]] == [usable_cpus()]
    k = len(usable_cpus()) // 2
    got = sorted(r["cpus"] for r in by_host["fakehost"])
    assert got == [usable_cpus()[:k], usable_cpus()[k : 2 * k]], by_host
