"""The KVStore API with real processes: init, sharding, rules, async forms, errors, failures."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unison.ps as ps
from unison.errors import InvalidArgumentError
from unison.ps.wire import PsOp
from unison.world import current

from ._harness import run_ps, run_ps_outcomes

pytestmark = pytest.mark.timeout(60)


def _init_and_shard(kv: ps.KVStore) -> dict[str, Any]:
    mine = {"big": np.full((40, 25), float(kv.rank), np.float32), "small": np.arange(3.0) + kv.rank}
    got = kv.init_params(mine)
    assert got["big"] is mine["big"]  # written in place
    return {"big": got["big"].copy(), "small": got["small"].copy(), "where": kv.placement()}


def test_first_writer_wins_and_big_keys_are_split_over_every_server() -> None:
    got, servers = run_ps(_init_and_shard, 3, 3, ps.ASP(), split_bytes=1024)
    first = got[0]["big"][0, 0]
    assert first in (0.0, 1.0, 2.0)
    for g in got:  # every worker holds the same values: one worker's
        np.testing.assert_array_equal(g["big"], np.full((40, 25), first, np.float32))
        np.testing.assert_array_equal(g["small"], np.arange(3.0) + g["small"][0])
        assert g["small"][0] == got[0]["small"][0]
    where = got[0]["where"]
    assert sorted(r for r, _, _ in where["big"]) == [3, 4, 5]  # one piece on each server
    assert sum(stop - start for _, start, stop in where["big"]) == 1000
    assert len(where["small"]) == 1 and where == got[1]["where"] == got[2]["where"]
    assert sum(s.keys for s in servers) == 4  # 3 pieces of "big" + "small"


def _rules_async_torch(kv: ps.KVStore) -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    kv.init_params({"v": np.zeros(4), "t": torch.zeros(2, 3)})
    kv.set_optimizer(ps.Assign())
    works = [kv.ipush({"v": np.full(4, float(i))}) for i in range(1, 31)]
    for w in works:
        w.wait()
    ordered = kv.pull("v")["v"].copy()  # pushes of one worker are applied in order
    kv.set_optimizer(ps.Custom(_double_plus))
    kv.push({"v": np.ones(4)})
    custom = kv.pull("v")["v"].copy()
    out = torch.empty(2, 3)
    kv.set_optimizer(ps.Sum())
    kv.push({"t": torch.ones(2, 3)})
    work = kv.ipull({"t": out})
    got = work.result()
    assert got["t"] is out and work.is_completed() and work.exception() is None
    return {"ordered": ordered, "custom": custom, "t": out.numpy().copy()}


def _double_plus(key: str, stored: np.ndarray, update: np.ndarray, state: dict[str, Any]) -> None:
    stored *= 2
    stored += update


def test_rules_ordered_async_pushes_custom_function_and_torch_buffers() -> None:
    (got,), _ = run_ps(_rules_async_torch, 1, 2, ps.ASP())
    np.testing.assert_array_equal(got["ordered"], np.full(4, 30.0))
    np.testing.assert_array_equal(got["custom"], np.full(4, 61.0))
    np.testing.assert_array_equal(got["t"], np.ones((2, 3)))


def _bad_inputs(kv: ps.KVStore) -> list[str]:
    kv.init_params({"w": np.ones(8), "n": np.zeros(2, np.int64)})
    kv.set_optimizer(ps.SGD(lr=0.5))
    errors = []
    if kv.rank == 0:
        attempts = [
            lambda: kv.push({"never": np.ones(3)}),
            lambda: kv.pull(["never"]),
            lambda: kv.push({"w": np.ones(9)}),
            lambda: kv.push({"w": np.ones(8, np.float32)}),
            lambda: kv.pull({"w": np.empty(3)}),
            lambda: kv.push({"n": np.ones(2, np.int64)}),  # SGD on an integer key
            lambda: kv.init_params({"w": np.ones(5)}),
            # forged on the wire, past the client's checks: the server's own validation
            lambda: _forged_push(kv, np.ones(3)),
            lambda: _forged_push(kv, np.ones(8, np.float32)),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidArgumentError) as info:
                attempt()
            errors.append(str(info.value))
    kv.push({"w": np.ones(8)})  # everyone keeps being served
    kv.clock()
    time.sleep(0.2)
    return [*errors, repr(kv.pull("w")["w"].tolist())]


def _forged_push(kv: ps.KVStore, arr: np.ndarray) -> None:
    ch = kv._servers[kv.placement()["w"][0][0] - kv.num_workers]
    meta = {"pieces": [["w", 0]], "arrays": [[arr.dtype.str, arr.size]]}
    ch.request(PsOp.PUSH, "push", kv.current_clock, meta, [arr]).wait()


def test_bad_input_fails_only_that_call_and_data_stays_intact() -> None:
    got, servers = run_ps(_bad_inputs, 2, 1, ps.ASP())
    errors = got[0][:-1]
    assert len(errors) == 9
    assert "never" in errors[0] and "never initialised" in errors[0]
    assert "never" in errors[1] and "unknown" in errors[1]
    # the operation is named as the user called it, the server once (issue 12 item 14)
    assert errors[0].startswith("push (server rank "), errors[0]
    assert errors[1].startswith("pull (server rank "), errors[1]
    assert errors[1].count("server rank") == 1 and "init_params (" not in errors[1]
    assert "shape (8,)" in errors[2] and "(9,)" in errors[2]
    assert "float32" in errors[3]
    assert "buffer given" in errors[4]
    assert "floating-point" in errors[5]
    assert "first writer wins" in errors[6]
    assert "server rank" in errors[7] and "8 elements" in errors[7] and "3 elements" in errors[7]
    assert "server rank" in errors[8] and "float32" in errors[8]
    # only the two good pushes landed: 1 - 0.5 * 2
    assert got[0][-1] == got[1][-1] == repr([0.0] * 8)
    assert servers[0].failure is None


def _dies(kv: ps.KVStore) -> int:
    kv.init_params({"w": np.zeros(16)})
    for step in range(40):
        kv.pull("w")
        kv.push({"w": np.ones(16)})
        kv.clock()
        if kv.rank == 1 and step == 2:
            os._exit(3)
    return kv.current_clock


def test_dead_worker_is_named_and_the_job_ends_within_the_timeout() -> None:
    start = time.monotonic()
    outs = run_ps_outcomes(_dies, 3, 1, ps.BSP(), timeout=8.0)
    assert time.monotonic() - start < 20
    assert outs[1].exitcode == 3
    for o in (outs[0], outs[2]):
        assert not o.ok and o.error_type == "PeerLostError", o.describe()
        assert "worker rank 1 was lost" in o.message
    assert outs[3].ok and "worker rank 1" in str(outs[3].value.failure)


def _server_gone_between_requests(kv: ps.KVStore) -> int:
    kv.init_params({"w": np.zeros(4)})
    kv.pull("w")  # nothing is pending from here on: no reply is awaited when the server dies
    rt = current()
    os.kill(rt.infos[rt.size - 1].pid, signal.SIGKILL)  # type: ignore[attr-defined]
    time.sleep(1.0)  # the loss reaches this rank's transports
    kv.clock()  # its send is the first to meet the loss
    kv.pull("w")
    return kv.current_clock


def test_a_server_lost_between_requests_is_named_by_the_next_one() -> None:
    """The send path names the lost server as the reply path does."""
    outs = run_ps_outcomes(_server_gone_between_requests, 1, 1, ps.ASP(), timeout=8.0)
    assert outs[1].exitcode == -signal.SIGKILL, outs[1].describe()
    o = outs[0]
    assert not o.ok and o.error_type == "PeerLostError", o.describe()
    assert o.message.startswith("parameter server rank 1 was lost"), o.message


def _checkpoint(kv: ps.KVStore, path: str) -> dict[str, Any]:
    kv.init_params({"a": np.arange(100.0).reshape(10, 10), "b": np.arange(5, dtype=np.int32)})
    kv.set_optimizer(ps.Sum())
    kv.push({"b": np.ones(5, np.int32)})
    kv.clock()
    if kv.rank == 0:
        kv.save(path)
    return kv.pull(["a", "b"])


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    (got,), _ = run_ps(_checkpoint, 1, 2, ps.BSP(), args=(path,), split_bytes=64)
    loaded = ps.load(path)
    assert sorted(os.listdir(path)) == ["manifest.json", "server-0.npz", "server-1.npz"]
    np.testing.assert_array_equal(loaded["a"], got["a"])
    np.testing.assert_array_equal(loaded["b"], np.arange(5, dtype=np.int32) + 1)
    assert loaded["b"].dtype == np.int32 and loaded["a"].shape == (10, 10)
    with pytest.raises(InvalidArgumentError):
        ps.load(str(tmp_path))


def test_workers_must_agree_on_the_consistency() -> None:
    from unison.testing import run_ranks

    def job() -> None:
        import unison

        ps.init(ps.SSP(unison.rank()), split_bytes=1 << 20)

    outs = run_ranks(job, 3, env={"UNISON_NUM_SERVERS": "1", "UNISON_TIMEOUT": "10"}, timeout=30)
    assert all(not o.ok and o.error_type == "MismatchError" for o in outs), outs
    assert "disagree" in outs[0].message
