"""RayExecutor on a local Ray instance: placement, environment, results in rank order,
collectives against a numpy oracle, failures named by rank, Horovod's argument checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'unison-collectives[ray]')")

import ray

from unison.errors import LaunchError, UnisonError, UnsupportedError
from unison.jobenv import usable_cores
from unison.launch.rankenv import THREAD_VARIABLES
from unison.ray import (
    RayExecutor,
    RayHostDiscovery,
    RayStartTimeoutError,
    RayWorkerLostError,
)

pytestmark = pytest.mark.usefixtures("ray_local")

SIZE = 3


class Holder:
    """An executable_cls: built once per actor with the start() arguments."""

    def __init__(self, base: int, *, scale: int = 1) -> None:
        self.value = base * scale


def identity(_exe: Any) -> dict[str, str]:
    keys = [
        "UNISON_RANK",
        "UNISON_SIZE",
        "UNISON_LOCAL_RANK",
        "UNISON_LOCAL_SIZE",
        "UNISON_CROSS_RANK",
        "UNISON_CROSS_SIZE",
        "HOROVOD_RANK",
        "HOROVOD_LOCAL_SIZE",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_PORT",
        "UNISON_JOB_ID",
        "EXTRA",
        *THREAD_VARIABLES,
    ]
    return {k: os.environ.get(k, "") for k in keys}


def all_reduce_case(seed: int) -> list[np.ndarray]:
    """Several dtypes, shapes and ops; the inputs are rebuilt by the oracle from the seed."""
    import unison

    unison.init()
    rank = unison.rank()
    out = []
    for dtype, shape, op in _CASES:
        x = _input(seed, rank, dtype, shape)
        unison.all_reduce(x, op=getattr(unison.ReduceOp, op))
        out.append(x)
    unison.shutdown()  # the next run() joins again (a new epoch on the same store)
    return out


_CASES = [
    ("float64", (5,), "SUM"),
    ("float32", (3, 4), "SUM"),
    ("int64", (7,), "MAX"),
    ("int32", (2, 2, 2), "MIN"),
    ("float64", (100_003,), "SUM"),  # several pipeline segments
]


def _input(seed: int, rank: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    return (rng.integers(-50, 50, size=shape)).astype(dtype)


def fail_on_rank_one() -> int:
    import unison

    unison.init()
    x = np.ones(4)
    unison.all_reduce(x)
    if unison.rank() == 1:
        raise ValueError("bad batch on this rank")
    unison.all_reduce(x)  # rank 0 blocks here until rank 1 leaves the job
    return unison.rank()


def killed_mid_job() -> None:
    import unison

    unison.init()
    x = np.ones(8)
    unison.all_reduce(x)
    if unison.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(1000):
        unison.all_reduce(x)


def log_values(scale: int) -> int:
    from unison.ray import ray_logger

    rank = int(os.environ["UNISON_RANK"])
    for step in range(3):
        ray_logger.log({"step": step * scale})  # rank 0's only
    ray_logger.log({"rank": rank}, chief_only=False)
    return rank


def test_run_execute_collectives_and_failures(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for name in THREAD_VARIABLES:  # the driver's user chose no thread count
        monkeypatch.delenv(name, raising=False)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=SIZE)
    ex.start(
        executable_cls=Holder,
        executable_args=[7],
        executable_kwargs={"scale": 2},
        extra_env_vars={"EXTRA": "yes"},
    )
    try:
        # environment: unison's, Horovod's and torchrun's, one job, ranks packed per node
        envs = ex.execute(identity)
        assert [e["UNISON_RANK"] for e in envs] == ["0", "1", "2"]
        assert [e["HOROVOD_RANK"] for e in envs] == ["0", "1", "2"]
        assert [e["RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["UNISON_SIZE"] for e in envs} == {"3"} == {e["WORLD_SIZE"] for e in envs}
        # PACK on two nodes of 2 CPUs: two ranks on the first node, one on the second
        assert [e["UNISON_LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
        assert [e["UNISON_LOCAL_SIZE"] for e in envs] == ["2", "2", "1"]
        assert [e["HOROVOD_LOCAL_SIZE"] for e in envs] == ["2", "2", "1"]
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
        assert [(e["UNISON_CROSS_RANK"], e["UNISON_CROSS_SIZE"]) for e in envs] == [
            ("0", "2"),
            ("0", "2"),
            ("1", "2"),
        ]
        assert len({e["UNISON_JOB_ID"] for e in envs}) == 1 and envs[0]["UNISON_JOB_ID"]
        assert len({e["MASTER_PORT"] for e in envs}) == 1
        assert {e["EXTRA"] for e in envs} == {"yes"}
        assert len(ex.workers) == SIZE
        # torchrun's habit: the two Ray nodes here are one host (one address), so its
        # cores are divided among all three ranks, every knob, said once
        share = str(max(1, usable_cores() // SIZE))
        for e in envs:
            assert {k: e[k] for k in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, share)
        said = [ln for ln in capfd.readouterr().err.splitlines() if "share this host" in ln]
        assert len(said) == 1 and said[0].startswith("unison.ray: 3 ranks share"), said

        # execute gets the executable; run gets args/kwargs; results in rank order
        assert ex.execute(lambda h: h.value) == [14] * SIZE
        assert ex.execute_single(lambda h: (h.value, os.environ["UNISON_RANK"])) == (14, "0")
        assert ex.run(
            lambda a, b=0: (int(os.environ["UNISON_RANK"]), a + b), args=[1], kwargs={"b": 2}
        ) == [(r, 3) for r in range(SIZE)]
        refs = ex.run_remote(lambda: os.environ["UNISON_RANK"])
        assert ray.get(refs, timeout=60) == ["0", "1", "2"]

        # callbacks get what rank 0 logs (every rank with chief_only=False), in order
        seen: list[dict[str, int]] = []
        assert ex.run(log_values, args=[10], callbacks=[seen.append]) == [0, 1, 2]
        assert [d for d in seen if "step" in d] == [{"step": 0}, {"step": 10}, {"step": 20}]
        assert sorted(d["rank"] for d in seen if "rank" in d) == [0, 1, 2], seen
        seen.clear()
        assert ex.execute(lambda h: log_values(h.value), callbacks=[seen.append]) == [0, 1, 2]
        assert [d["step"] for d in seen if "step" in d] == [0, 14, 28], seen

        # all_reduce across the actors against numpy, twice (re-init on the same store)
        for seed in (1, 2):
            results = ex.run(all_reduce_case, args=[seed])
            for i, (dtype, shape, op) in enumerate(_CASES):
                inputs = np.stack([_input(seed, r, dtype, shape) for r in range(SIZE)])
                want = {"SUM": inputs.sum(0), "MAX": inputs.max(0), "MIN": inputs.min(0)}[op]
                for r in range(SIZE):
                    got = results[r][i]
                    assert got.dtype == np.dtype(dtype) and got.shape == shape
                    np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-6)

        # a function that raises: re-raised as Ray raises it (an instance of the original
        # class), noting the rank; the rank blocked on it fails too and is not the one named
        with pytest.raises(ValueError, match="bad batch") as info:
            ex.run(fail_on_rank_one)
        assert isinstance(info.value, ray.exceptions.RayTaskError)
        assert "raised by rank 1 of 3" in "".join(getattr(info.value, "__notes__", []))
        # ...and the executor is still usable: every rank left the broken job
        assert ex.run(lambda: os.environ["UNISON_RANK"]) == ["0", "1", "2"]

        # a killed actor: a typed error naming the rank, and the executor shuts down
        with pytest.raises(RayWorkerLostError) as lost:
            ex.run(killed_mid_job)
        err = lost.value
        assert err.rank == 1 and err.ranks == (1,) and err.size == SIZE
        assert "rank 1 of 3 lost" in str(err)
        assert isinstance(err, UnisonError) and isinstance(err, ray.exceptions.RayActorError)
        with pytest.raises(LaunchError, match="rank 1 was lost"):
            ex.run(lambda: 0)
        assert ex.workers == []
    finally:
        ex.shutdown()


def _layout_seen_by_unison() -> tuple[int, int, int, int, int, str]:
    import unison

    unison.init()
    seen = (
        unison.rank(),
        unison.local_rank(),
        unison.local_size(),
        unison.cross_rank(),
        unison.cross_size(),
        ray.get_runtime_context().get_node_id(),
    )
    unison.barrier()
    unison.shutdown()
    return seen


def test_num_hosts_layout_and_placement_timeout() -> None:
    ex = RayExecutor(None, num_hosts=2, num_workers_per_host=2)
    ex.start()
    try:
        got = ex.run(_layout_seen_by_unison)
        # two per node, consecutive; unison's own view agrees with the environment
        assert [g[:5] for g in got] == [
            (0, 0, 2, 0, 2),
            (1, 1, 2, 0, 2),
            (2, 0, 2, 1, 2),
            (3, 1, 2, 1, 2),
        ]
        assert got[0][5] == got[1][5] != got[2][5] == got[3][5]  # Ray node ids
    finally:
        ex.shutdown()
    # use_gpu: one GPU per actor; each sees every GPU given to its node's actors (Horovod)
    gpu = RayExecutor(None, num_workers=3, use_gpu=True)
    gpu.start(extra_env_vars={"MKL_NUM_THREADS": "5"})  # the user chose: no share is set
    try:
        threads = gpu.execute(lambda _: {k: os.environ.get(k) for k in THREAD_VARIABLES})
        for t in threads:
            assert t["MKL_NUM_THREADS"] == "5", t
            assert t["OPENBLAS_NUM_THREADS"] is None is t["TF_NUM_INTRAOP_THREADS"], t
        seen = gpu.execute(lambda _: (os.environ["CUDA_VISIBLE_DEVICES"], ray.get_gpu_ids()))
        node_a = sorted(str(g) for _, ids in seen[:2] for g in ids)
        assert len(node_a) == 2 and len(set(node_a)) == 2
        assert sorted(seen[0][0].split(",")) == sorted(seen[1][0].split(",")) == node_a
        assert seen[2][0] == ",".join(str(g) for g in seen[2][1]) and len(seen[2][1]) == 1
    finally:
        gpu.shutdown()
    # more CPUs than the cluster has: Horovod's timeout text, a unison error and a TimeoutError
    big = RayExecutor(
        RayExecutor.create_settings(timeout_s=10, placement_group_timeout_s=1),
        num_workers=1,
        cpus_per_worker=64,
    )
    with pytest.raises(RayStartTimeoutError, match="Placement group creation timed out") as info:
        big.start()
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, LaunchError)
    with pytest.raises(LaunchError, match="not started"):
        big.run(lambda: 0)


def test_horovod_argument_checks() -> None:
    with pytest.raises(ValueError, match="gpus_per_worker is set, but use_gpu is False"):
        RayExecutor(None, num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="gpus_per_worker must be >= 1: Got 0"):
        RayExecutor(None, num_workers=2, use_gpu=True, gpus_per_worker=0)
    with pytest.raises(ValueError, match="without any positive `min_workers`"):
        RayExecutor(None, max_workers=4)
    with pytest.raises(ValueError, match="Both `min_workers` and `num_workers` provided"):
        RayExecutor(None, num_workers=2, min_workers=1)
    with pytest.raises(ValueError, match="need 1 <= min_workers <= max_workers"):
        RayExecutor(None, min_workers=3, max_workers=2)
    elastic = RayExecutor(None, min_workers=1, max_workers=2)  # Horovod's elastic refusals
    with pytest.raises(UnsupportedError, match="ObjectRefs cannot be returned from Elastic"):
        elastic.run_remote(lambda: 0)
    with pytest.raises(NotImplementedError, match="does not support execute_single"):
        elastic.execute_single(lambda _: 0)
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        RayExecutor(None, num_workers=0)
    s = RayExecutor.create_settings(timeout_s=12, placement_group_timeout_s=7, nics={"lo"})
    assert (s.timeout_s, s.placement_group_timeout_s, s.nics) == (12, 7, {"lo"})
    assert RayExecutor.create_settings().timeout_s == 30  # Horovod's default


def test_import_unison_does_not_import_ray() -> None:
    code = "import sys, unison, unison.torch; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def ps_job(steps: int) -> list[float] | None:
    """BSP SGD on one key: 2 workers push (worker+1)*(step+1); the last rank serves."""
    import unison
    import unison.ps as ps

    kv = ps.init(consistency=ps.BSP())  # the server serves here, then returns None
    w = np.zeros(4)
    kv.init_params({"w": w})
    kv.set_optimizer(ps.SGD(lr=0.1))
    worker = unison.rank()
    for step in range(steps):
        kv.pull({"w": w})
        kv.push({"w": np.full(4, float((worker + 1) * (step + 1)))})
        kv.clock()
    kv.pull({"w": w})
    kv.close()
    unison.shutdown()
    return [float(v) for v in w]


def test_parameter_server_job_on_actors() -> None:
    ex = RayExecutor(None, num_workers=3, num_servers=1)
    ex.start()
    try:
        roles = ex.execute(lambda _: os.environ.get("UNISON_ROLE"))
        assert roles == ["worker", "worker", "server"]
        steps = 3
        want = -0.1 * sum((1 + 2) * (s + 1) for s in range(steps))  # SGD on the summed pushes
        got = ex.run(ps_job, args=[steps])
        assert got[2] is None  # the server's call ends when its workers are done
        for w in got[:2]:
            np.testing.assert_allclose(w, [want] * 4, rtol=1e-12)
    finally:
        ex.shutdown()
    with pytest.raises(ValueError, match=r"num_servers must be in 0\.\.1"):
        RayExecutor(None, num_workers=2, num_servers=2)


def test_ray_node_membership_as_discovery_script(capsys: pytest.CaptureFixture[str]) -> None:
    from unison.ray.discovery import format_hosts, main

    ip = ray.util.get_node_ip_address()
    assert RayHostDiscovery().find_available_hosts_and_slots() == {
        ip: 4
    }  # 2 nodes x 2 CPUs, one address
    assert RayHostDiscovery(cpus_per_worker=3).find_available_hosts_and_slots() == {ip: 0}
    assert RayHostDiscovery(use_gpu=True).find_available_hosts_and_slots() == {ip: 4}
    assert RayHostDiscovery(use_gpu=True, gpus_per_worker=2).find_available_hosts_and_slots() == {
        ip: 2
    }
    assert RayHostDiscovery(cpus_per_worker=2).find_available_hosts_and_slots() == {ip: 2}
    assert main(["--cpus-per-worker", "1"]) == 0
    assert capsys.readouterr().out == f"{ip}:4\n"  # Horovod's discovery-script format
    assert format_hosts({"a": 2, "b": 0, "c": 1}) == "a:2\nc:1\n"
