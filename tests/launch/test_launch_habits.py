"""The habits people bring to ``unison run``: torchrun's per-rank thread count,
horovodrun's and mpirun's flags (mapped to the variables the engine reads, accepted with
one line saying why they change nothing, or refused naming what to do), Horovod's
variables treated as unknown ``UNISON_*`` ones are, ``unison run train.py``, one-line
usage errors, and log lines a user can act on."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison import config as C
from unison import jobenv
from unison.launch.rankenv import THREAD_VARIABLES, thread_environment, usable_cores

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "unison", "run"]
SHOW_ENV = (
    "import json, os; print('ENV ' + json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('UNISON_', 'OMP_', 'MKL_', 'OPENBLAS_', 'TF_NUM_'))}))"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith(("UNISON_", "HOROVOD_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, env=env or _env(), timeout=100, cwd=ROOT
    )


def _envs(stdout: str) -> list[dict[str, str]]:
    out = []
    for line in sorted(stdout.splitlines()):
        body = line.partition("ENV ")[2]
        if body:
            out.append(json.loads(body))
    return out


# -- item 2: the thread count ----------------------------------------------------------
def test_thread_share_divides_cores_and_never_overrides() -> None:
    assert thread_environment({}, 3, 8) == dict.fromkeys(THREAD_VARIABLES, "2")
    assert thread_environment({}, 4, 2) == dict.fromkeys(THREAD_VARIABLES, "1")  # at least 1
    assert thread_environment({}, 1, 8) == {}  # one rank has the host: library defaults
    assert thread_environment({"MKL_NUM_THREADS": "4"}, 2, 8) == {}  # the user chose


def test_ranks_get_a_share_of_the_cores_with_one_notice() -> None:
    share = str(max(1, usable_cores() // 2))
    r = _run("-np", "2", sys.executable, "-c", SHOW_ENV)
    assert r.returncode == 0, r.stderr
    for env in _envs(r.stdout):
        assert {k: env.get(k) for k in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, share)
    notices = [ln for ln in r.stderr.splitlines() if "ranks share this host's" in ln]
    assert len(notices) == 1 and f"OMP_NUM_THREADS={share}" in notices[0], r.stderr
    # the user's value wins, for every knob, and nothing is said
    r = _run("-np", "2", "-x", "OMP_NUM_THREADS=3", sys.executable, "-c", SHOW_ENV)
    assert r.returncode == 0 and "share this host" not in r.stderr, r.stderr
    for env in _envs(r.stdout):
        assert env["OMP_NUM_THREADS"] == "3"
        assert not any(k in env for k in THREAD_VARIABLES[1:]), env
    r = _run("-np", "1", sys.executable, "-c", SHOW_ENV)
    assert r.returncode == 0 and "share this host" not in r.stderr
    assert not any(k in _envs(r.stdout)[0] for k in THREAD_VARIABLES)


def test_torch_in_a_rank_runs_the_shared_thread_count() -> None:
    pytest.importorskip("torch")
    share = max(1, usable_cores() // 2)
    code = "import torch; print('THREADS', torch.get_num_threads())"
    r = _run("-np", "2", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(["[0]", "[1]"] + ["THREADS", str(share)] * 2)


# -- item 3: horovodrun's and mpirun's flags ---------------------------------------------
def test_horovodrun_flags_set_the_variables_the_engine_reads(tmp_path: Path) -> None:
    timeline = str(tmp_path / "tl.json")
    code = (
        "import json; from unison.config import load_config; c = load_config(); "
        "print('CFG ' + json.dumps([c.timeline, c.timeline_mark_cycles, c.log_level, "
        "c.fusion_threshold, c.cycle_time, c.cache_capacity, c.stall_check_disable, "
        "c.stall_check_time, c.stall_shutdown_time, c.network_interface]))"
    )
    r = _run(
        "-np", "1", "--host", "localhost:1", "--gloo", "--timeline-filename", timeline,
        "--timeline-mark-cycles", "--log-level", "trace", "--fusion-threshold-mb", "2",
        "--cycle-time-ms", "3.5", "--cache-capacity", "7", "--no-stall-check",
        "--stall-check-warning-time-seconds", "9", "--stall-check-shutdown-time-seconds",
        "11", "--network-interfaces", "lo", sys.executable, "-c", code,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # mapped flags say nothing
    got = json.loads(r.stdout.split("CFG ", 1)[1])
    assert got == [timeline, True, "DEBUG", 2 << 20, 3.5, 7, True, 9.0, 11.0, "lo"]


def test_flags_with_nothing_to_do_say_so_in_one_line_each() -> None:
    r = _run(
        "-np", "1", "--disable-cache", "--hierarchical-allreduce", "--autotune",
        "--autotune-log-file", "x.csv", "-bind-to", "socket", "--map-by", "node", "-mca",
        "btl", "self,tcp", "--allow-run-as-root", "--mca", "btl_tcp_if_include", "lo",
        sys.executable, "-m", "json.tool", "--help",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 6, r.stderr
    for says in ("--disable-cache ignored", "--hierarchical-* ignored", "--autotune ignored",
                 "--bind-to socket taken as core", "--map-by node ignored",
                 "--mca btl ignored"):  # fmt: skip
        assert sum(ln.startswith(f"unison run: {says}") for ln in lines) == 1, (says, lines)
    assert "usage:" not in r.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--mpi"], "mpirun -np N -x UNISON_BACKEND=mpi python SCRIPT"),
        (["--jsrun"], "mpirun -np N -x UNISON_BACKEND=mpi python SCRIPT"),
        (["--check-build"], "`unison info`"),
        (["-map-by", "slot"], "did you mean --map-by?"),
        (["--oversubscrbe"], "did you mean --oversubscribe?"),
        (["-np", "two"], "invalid int value: 'two'"),
        (["--log-level", "loud"], "'loud' is not one of"),
    ],
)
def test_refusals_are_one_line_naming_what_to_do(argv: list[str], says: str) -> None:
    r = _run(*argv, "true")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr


def test_a_python_file_runs_with_this_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys; print('PY', sys.executable, sys.argv[1:])\n")
    r = _run("-np", "2", str(script), "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        f"[{i}] PY {sys.executable} ['--lr', '0.1']" for i in range(2)
    ]
    assert f"unison run: running {script} with {sys.executable}" in r.stderr
    r = _run("-np", "1", str(tmp_path / "missing.py"))
    assert r.returncode == 127 and "not found" in r.stderr


# -- item 3: Horovod's variables -----------------------------------------------------------
def test_horovod_variables_are_mapped_or_named_as_ignored() -> None:
    cfg = C.load_config({"HOROVOD_LOG_LEVEL": "trace", "HOROVOD_FUSION_THRESHOLD": "1024"})
    assert (cfg.log_level, cfg.fusion_threshold) == ("DEBUG", 1024)
    both = {"HOROVOD_CYCLE_TIME": "5", "UNISON_CYCLE_TIME": "2"}
    assert C.load_config(both).cycle_time == 2.0  # unison's own name wins
    with pytest.raises(C.InvalidArgumentError, match="HOROVOD_CACHE_CAPACITY='many'"):
        C.load_config({"HOROVOD_CACHE_CAPACITY": "many"})
    env = {
        "HOROVOD_AUTOTUNE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_FUSION_THRESHHOLD": "1",
        "HOROVOD_SOMETHING_ELSE": "1", "HOROVOD_LOG_LEVEL": "info", "HOROVOD_RANK": "0",
        "HOROVOD_WITH_PYTORCH": "1", "UNISON_TIMEUOT": "3",
    }  # fmt: skip
    why = dict(C.ignored_variables(env))
    assert sorted(why) == [
        "HOROVOD_AUTOTUNE", "HOROVOD_FUSION_THRESHHOLD", "HOROVOD_HIERARCHICAL_ALLGATHER",
        "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_SOMETHING_ELSE", "UNISON_TIMEUOT",
    ]  # fmt: skip
    assert "UNISON_ALGO" in why["HOROVOD_AUTOTUNE"]
    assert "UNISON_ALGO=all_reduce:hierarchical" in why["HOROVOD_HIERARCHICAL_ALLREDUCE"]
    assert why["HOROVOD_FUSION_THRESHHOLD"].endswith(
        "did you mean HOROVOD_FUSION_THRESHOLD (UNISON_FUSION_THRESHOLD)?"
    )
    assert "unison reads no such variable" in why["HOROVOD_SOMETHING_ELSE"]
    assert why["UNISON_TIMEUOT"].endswith("did you mean UNISON_TIMEOUT?")


def test_a_job_names_each_ignored_horovod_variable_once() -> None:
    env = _env(HOROVOD_AUTOTUNE="1", HOROVOD_HIERARCHICAL_ALLREDUCE="1")
    code = "import unison as un; un.init(); un.barrier(); un.shutdown()"
    r = _run("-np", "2", sys.executable, "-c", code, env=env)
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "is ignored" in ln]
    assert len(warned) == 2, r.stderr  # rank 0 speaks for the job
    assert all(ln.startswith("[0] unison.") and "WARNING" in ln for ln in warned), warned


# -- item 8: log lines --------------------------------------------------------------------
LOG = (
    "import unison.log as L; L.configure('WARNING'); L.set_rank(0); L.get_logger('x').warning('hi')"
)


def test_log_lines_carry_one_rank_prefix() -> None:
    r = _run("-np", "1", sys.executable, "-c", LOG)
    assert r.returncode == 0 and r.stderr.splitlines() == ["[0] unison.x WARNING: hi"], r.stderr
    r = _run("-np", "1", "--no-prefix", sys.executable, "-c", LOG)
    assert r.stderr.splitlines() == ["unison[0] unison.x WARNING: hi"], r.stderr
    r = subprocess.run([sys.executable, "-c", LOG], capture_output=True, text=True, env=_env())
    assert r.stderr.splitlines() == ["unison[0] unison.x WARNING: hi"], r.stderr  # mpirun...


def _torchrun_env(master: str, rank: str) -> dict[str, str]:
    return {
        "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": master,
        "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "RANK": rank, "LOCAL_RANK": rank,
    }  # fmt: skip


def _secret_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    return [(level, text) for level, text in records if "UNISON_SECRET" in text]


def test_missing_secret_is_info_on_loopback_and_a_fix_when_exposed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="unison"):
        jobenv.detect_job(_torchrun_env("127.0.0.1", "0"))
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if "UNISON_SECRET" in r.getMessage()
    ]
    assert len(said) == 1 and said[0][0] == "INFO" and "loopback" in said[0][1], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="unison"):
        jobenv.detect_job(_torchrun_env("10.1.2.3", "0"))
        jobenv.detect_job(_torchrun_env("10.1.2.3", "1"))  # rank 1 says nothing
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if "UNISON_SECRET" in r.getMessage()
    ]
    assert len(said) == 1 and said[0][0] == "WARNING", said
    assert "export UNISON_SECRET=<the same hex on every host> before torchrun" in said[0][1]


def test_elastic_workers_share_the_host_cores_too() -> None:
    share = str(max(1, usable_cores() // 2))
    r = _run("-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:2",
             sys.executable, "-c", SHOW_ENV)  # fmt: skip
    assert r.returncode == 0, r.stderr
    envs = _envs(r.stdout)
    assert len(envs) == 2, r.stdout
    for env in envs:
        assert {k: env.get(k) for k in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, share)
    assert sum("ranks share this host's" in ln for ln in r.stderr.splitlines()) == 1, r.stderr


# remote hosts are simulated: the rsh agent is ``env``, which starts the remote wrapper
# (python -m unison.launch.remote) here under another host name, as ssh would there
FAKE_RSH = ["--rsh", "env UNISON_TEST_HOST={host}", "--store-addr", "127.0.0.1"]
SHOW_HOST_ENV = SHOW_ENV.replace("'TF_NUM_'", "'TF_NUM_', 'HOROVOD_HOSTNAME'")


def _by_host(r: subprocess.CompletedProcess[str]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for env in _envs(r.stdout):
        out.setdefault(env["HOROVOD_HOSTNAME"], []).append(env)
    return out


def _show_all(where: Path) -> str:
    """SHOW_HOST_ENV, flushed, for a job whose processes must all print: a parameter
    server waits (up to 60 s) until every worker has printed, since the driver ends
    the workers still running once the servers have exited."""
    return SHOW_HOST_ENV.replace("}))", "}), flush=True)") + (
        "\nimport pathlib, time\n"
        f"d = pathlib.Path({str(where)!r})\n"
        "if os.environ.get('UNISON_ROLE') == 'server':\n"
        "    n = int(os.environ['UNISON_SIZE']) - int(os.environ['UNISON_NUM_SERVERS'])\n"
        "    end = time.monotonic() + 60\n"
        "    while len(list(d.iterdir())) < n and time.monotonic() < end:\n"
        "        time.sleep(0.05)\n"
        "else:\n"
        "    (d / os.environ['UNISON_RANK']).touch()\n"
    )


@pytest.mark.parametrize("servers", [0, 1], ids=["elastic", "ps-elastic"])
def test_elastic_and_ps_processes_on_every_host_get_that_hosts_share(
    servers: int, tmp_path: Path
) -> None:
    """Elastic workers started through the remote shell, and the processes of an elastic
    parameter-server job (servers and workers), get their own host's share of its cores:
    the cores divided by the processes on that host; a host with one process (here
    localhost) keeps the libraries' defaults; a thread count the user set is left alone."""
    cores = usable_cores()
    np_ = ["-np", "4", "--min-np", "4", "--max-np", "4"] if servers else ["-np", "3"]
    np_ += ["--servers", "1"] if servers else ["--min-np", "3", "--max-np", "3"]
    hosts = "localhost:2,fakehost:2" if servers else "localhost:1,fakehost:2"
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    r = _run(*np_, "-H", hosts, *FAKE_RSH, sys.executable, "-c", _show_all(tmp_path / "1"))
    assert r.returncode == 0, r.stderr
    by_host = _by_host(r)
    assert sorted(by_host) == ["fakehost", "localhost"], r.stdout
    for host, envs in by_host.items():
        assert len(envs) == (2 if servers or host == "fakehost" else 1), r.stdout
        want = dict.fromkeys(THREAD_VARIABLES, str(max(1, cores // 2)))
        if len(envs) == 1:
            want = dict.fromkeys(THREAD_VARIABLES)  # one process has the host
        for env in envs:
            assert {k: env.get(k) for k in THREAD_VARIABLES} == want, (host, env)
    # the user's value wins on every host, for every knob, and nothing is said
    r = _run(*np_, "-H", hosts, *FAKE_RSH, "-x", "OMP_NUM_THREADS=3",
             sys.executable, "-c", _show_all(tmp_path / "2"))  # fmt: skip
    assert r.returncode == 0 and "share this host" not in r.stderr, r.stderr
    envs = [e for es in _by_host(r).values() for e in es]
    assert len(envs) == (4 if servers else 3), r.stdout
    for env in envs:
        assert env["OMP_NUM_THREADS"] == "3", env
        assert not any(k in env for k in THREAD_VARIABLES[1:]), env
