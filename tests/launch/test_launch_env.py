"""detect_job: every launcher convention, fed plain dict environments (no processes)."""

from __future__ import annotations

import logging

import pytest

from unison.errors import InvalidArgumentError
from unison.jobenv import (
    FAILURE_KEY,
    JobInfo,
    detect_job,
    expand_nodelist,
    failure_record,
    launcher_layout,
    parse_failure_record,
    parse_store_addr,
    slurm_store_port,
)

pytestmark = pytest.mark.timeout(30)

SECRET_HEX = "ab" * 32


def test_nothing_set_is_single_process() -> None:
    info = detect_job({})
    assert info == JobInfo(0, 1, 0, 1, 0, 1, None, None, None, "single", False, "single")


def test_unison_variables() -> None:
    env = {
        "UNISON_RANK": "2",
        "UNISON_SIZE": "4",
        "UNISON_LOCAL_RANK": "0",
        "UNISON_LOCAL_SIZE": "2",
        "UNISON_CROSS_RANK": "1",
        "UNISON_CROSS_SIZE": "2",
        "UNISON_STORE_ADDR": "10.0.0.5:4242",
        "UNISON_SECRET": SECRET_HEX,
        "UNISON_JOB_ID": "job-9",
        # lower-precedence conventions present too: ignored
        "RANK": "0",
        "WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_RANK": "3",
    }
    info = detect_job(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (2, 4, 0, 2)
    assert (info.cross_rank, info.cross_size) == (1, 2)
    assert info.store_addr == ("10.0.0.5", 4242)
    assert info.secret == bytes.fromhex(SECRET_HEX)
    assert info.job_id == "job-9" and info.source == "unison" and not info.host_store
    assert info.store_path is None


def test_explicit_arguments_win() -> None:
    env = {
        "UNISON_RANK": "1",
        "UNISON_SIZE": "2",
        "UNISON_STORE_ADDR": "h:1",
        "UNISON_SECRET": SECRET_HEX,
    }
    info = detect_job(env, rank=0, size=3, store_addr="[::1]:7000", secret=b"k")
    assert (info.rank, info.size, info.source) == (0, 3, "explicit")
    assert info.store_addr == ("::1", 7000) and info.secret == b"k"
    assert info.host_store  # rank 0 of an explicit job hosts the address it was given
    assert info.local_rank is None
    other = detect_job({}, rank=1, size=3, store_addr=("127.0.0.1", 5), secret=b"k")
    assert other.store_addr == ("127.0.0.1", 5) and not other.host_store
    with pytest.raises(InvalidArgumentError, match="both"):
        detect_job({}, rank=1)
    with pytest.raises(InvalidArgumentError, match="rank"):
        detect_job({}, rank=3, size=3)
    with pytest.raises(InvalidArgumentError, match="UNISON_STORE_PATH"):
        detect_job({}, rank=0, size=2)  # no store anywhere


def test_torchrun(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "abc",
    }
    with caplog.at_level(logging.WARNING, logger="unison.launch"):
        info = detect_job(env)
    assert info.source == "torchrun" and info.host_store
    assert info.store_addr == ("node1", 29500)
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (0, 2, 0, 2)
    assert info.job_id == "torchrun-abc"
    assert info.secret is not None and len(info.secret) == 32
    assert any("give every rank a real one: export UNISON_SECRET=" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    # deterministic: every rank derives the same secret
    other = detect_job({**env, "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"})
    assert other.secret == info.secret and not other.host_store and other.cross_rank == 1
    # a different job gets a different secret
    assert detect_job({**env, "TORCHELASTIC_RUN_ID": "xyz"}).secret != info.secret


def test_launcher_layout_for_a_rank_known_elsewhere() -> None:
    """torch's backend constructor knows its rank and size; the launcher's variables say
    how many ranks share this host, only where they describe that very rank."""
    torchrun = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert launcher_layout(torchrun, 1, 4) == (1, 2)
    assert launcher_layout(torchrun, 0, 4) == (None, None)  # another rank's variables
    assert launcher_layout(torchrun, 1, 2) == (None, None)
    unison_run = {"UNISON_RANK": "0", "UNISON_SIZE": "2", "UNISON_LOCAL_RANK": "0",
                  "UNISON_LOCAL_SIZE": "2", **torchrun}  # fmt: skip
    assert launcher_layout(unison_run, 0, 2) == (0, 2)  # unison's own come first
    assert launcher_layout({}, 0, 2) == (None, None)
    assert launcher_layout({**torchrun, "WORLD_SIZE": "four"}, 1, 4) == (None, None)


def test_torchrun_agent_store_uses_next_port() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "m",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "UNISON_SECRET": SECRET_HEX,
    }
    info = detect_job(env)
    assert info.store_addr == ("m", 29501)
    assert info.secret == bytes.fromhex(SECRET_HEX)
    assert detect_job({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}).store_addr == ("m", 29500)


def test_openmpi_uses_file_store() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": "12345",
    }
    info = detect_job(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (1, 2, 1, 2)
    assert info.source == "openmpi" and info.store_addr is None
    assert info.store_path == "/tmp/unison-ompi-12345"
    assert info.secret is not None and not info.host_store
    shared = detect_job({**env, "UNISON_STORE_PATH": "/shared/x"})
    assert shared.store_path == "/shared/x"
    tcp = detect_job({**env, "UNISON_STORE_ADDR": "head:9999"})
    assert tcp.store_addr == ("head", 9999) and tcp.store_path is None
    pmix = detect_job(
        {k: v for k, v in env.items() if "ess" not in k} | {"PMIX_NAMESPACE": "prterun-host-1@1"}
    )
    assert pmix.store_path == "/tmp/unison-ompi-prterun-host-1_1"
    with pytest.raises(InvalidArgumentError, match="UNISON_STORE_PATH"):
        detect_job({k: v for k, v in env.items() if "ess" not in k})


def test_pmi_hydra() -> None:
    env = {
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "PMI_JOBID": "77",
    }
    info = detect_job(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (3, 4, 1, 2)
    assert info.source == "pmi" and info.store_path == "/tmp/unison-pmi-77"


def test_pmi_under_srun_uses_slurm_tcp_store() -> None:
    env = {
        "PMI_RANK": "0",
        "PMI_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_ID": "100",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "n[3-4]",
    }
    info = detect_job(env)
    assert info.source == "pmi" and info.store_addr == ("n3", slurm_store_port(100, 0))
    assert info.host_store and info.store_path is None


def test_slurm() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "6",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x3)",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-09]",
        "SLURM_NODELIST": "other1",
    }
    info = detect_job(env)
    assert info.source == "slurm"
    assert (info.rank, info.size, info.local_rank, info.local_size) == (5, 6, 1, 2)
    assert (info.cross_rank, info.cross_size) == (2, 3)
    assert info.store_addr == ("gpu07", slurm_store_port(4242, 1))
    assert info.job_id == "slurm-4242.1" and not info.host_store
    assert 20000 <= slurm_store_port(4242, 1) < 30000
    assert slurm_store_port(4242, 1) != slurm_store_port(4242, 2)
    zero = detect_job({**env, "SLURM_PROCID": "0", "SLURM_NTASKS_PER_NODE": "2"})
    assert zero.host_store and zero.local_size == 2
    uneven = detect_job({**env, "SLURM_TASKS_PER_NODE": "3,2(x2)"})
    assert uneven.local_size == 2
    with pytest.raises(InvalidArgumentError, match="NODELIST"):
        detect_job({k: v for k, v in env.items() if "NODELIST" not in k})


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
        ("single", ["single"]),
        ("a[1-2]-b[08-10]", ["a1-b08", "a1-b09", "a1-b10", "a2-b08", "a2-b09", "a2-b10"]),
        ("x[9-11],y,z[001]", ["x9", "x10", "x11", "y", "z001"]),
        ("h1.example.com,h2.example.com", ["h1.example.com", "h2.example.com"]),
    ],
)
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[a-b]", "node[5-3]", "n[1,-2]"])
def test_expand_nodelist_rejects_garbage(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        expand_nodelist(bad)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"UNISON_RANK": "x", "UNISON_SIZE": "2"}, "UNISON_RANK"),
        ({"UNISON_RANK": "2", "UNISON_SIZE": "2"}, "UNISON_RANK"),
        ({"UNISON_RANK": "-1", "UNISON_SIZE": "2"}, "UNISON_RANK"),
        ({"UNISON_RANK": "0", "UNISON_SIZE": "0"}, "UNISON_SIZE"),
        ({"UNISON_RANK": "0"}, "UNISON_SIZE"),
        ({"UNISON_RANK": "0", "UNISON_SIZE": "2", "UNISON_LOCAL_RANK": "1.5"}, "UNISON_LOCAL_RANK"),
        ({"UNISON_RANK": "0", "UNISON_SIZE": "2", "UNISON_SECRET": "zz"}, "UNISON_SECRET"),
        (
            {"UNISON_RANK": "0", "UNISON_SIZE": "2", "UNISON_STORE_ADDR": "nohost"},
            "UNISON_STORE_ADDR",
        ),
        ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_PORT": "1"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
        ({"PMI_RANK": "1", "PMI_SIZE": "one"}, "PMI_SIZE"),
        ({"SLURM_PROCID": "7", "SLURM_NTASKS": "2"}, "SLURM_PROCID"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        detect_job(env)


def test_store_addr_parsing() -> None:
    assert parse_store_addr("host:1") == ("host", 1)
    assert parse_store_addr("[fe80::1]:29500") == ("fe80::1", 29500)
    for bad in ("host", "host:0", "host:70000", ":5", "a:b"):
        with pytest.raises(InvalidArgumentError):
            parse_store_addr(bad)


def test_failure_records() -> None:
    assert FAILURE_KEY.format(rank=3) == "unison/failure/3"
    raw = failure_record("Traceback ...\nValueError: boom\n", when=12.5)
    assert parse_failure_record(raw) == ("ValueError: boom", 12.5)
    assert parse_failure_record(b"RuntimeError: plain text") == ("RuntimeError: plain text", None)
    assert parse_failure_record(b"") == ("unknown error", None)
    assert parse_failure_record(b'{"error": 5}')[0] == '{"error": 5}'
