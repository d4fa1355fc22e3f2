"""The parameter server with ``UNISON_PS_ELASTIC=1``: a worker that dies leaves the BSP
clock computation and the others finish, with every push that reached the servers
applied (numpy oracle: the sum of the pushes)."""

from __future__ import annotations

import os
import signal

import numpy as np

import unison.ps as ps
from tests.ps._harness import _entry, _env
from unison.testing import run_ranks
from unison.world import current


def _one_dies(kv: ps.KVStore) -> tuple[int, list[float]]:
    kv.init_params({"w": np.zeros(16)})
    kv.set_optimizer(ps.Sum())
    for step in range(20):
        kv.pull("w")
        kv.push({"w": np.ones(16)})
        kv.clock()
        if kv.rank == 1 and step == 2:
            os._exit(3)
    return kv.current_clock, kv.pull("w")["w"].tolist()


def test_lost_worker_leaves_the_clock_and_the_others_finish() -> None:
    env = {**_env(1, 10.0, None), "UNISON_PS_ELASTIC": "1"}
    outs = run_ranks(_entry, 4, args=(_one_dies, ps.BSP(), 1 << 20, ()), env=env, timeout=60.0)
    assert outs[1].exitcode == 3
    for o in (outs[0], outs[2]):
        assert o.ok, o.describe()
        clock, w = o.value
        # 20 pushes from each survivor, 3 from the worker that died (steps 0..2)
        assert clock == 20 and w == [43.0] * 16, o.value
    assert outs[3].ok and outs[3].value.failure is None, outs[3].describe()


def _server_dies(kv: ps.KVStore) -> int:
    kv.init_params({"w": np.zeros(4)})
    for step in range(20):
        if kv.rank == 0 and step == 2:
            rt = current()
            os.kill(rt.infos[rt.size - 1].pid, signal.SIGKILL)  # type: ignore[attr-defined]
        kv.pull("w")
        kv.push({"w": np.ones(4)})
        kv.clock()
    return kv.current_clock


def test_lost_server_fails_every_worker_naming_it_even_when_elastic() -> None:
    env = {**_env(1, 10.0, None), "UNISON_PS_ELASTIC": "1"}
    outs = run_ranks(_entry, 3, args=(_server_dies, ps.BSP(), 1 << 20, ()), env=env, timeout=60.0)
    assert outs[2].exitcode == -signal.SIGKILL, outs[2].describe()
    for o in outs[:2]:
        assert not o.ok and o.error_type == "PeerLostError", o.describe()
        assert "parameter server rank 2 was lost" in o.message, o.message
