"""unison.torch (the Horovod layer) and unison.ps on the torch backend, unchanged."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import unison.ps as ps

from ..ps._harness import run_ps
from ..ps.test_ps_api import _init_and_shard
from ..torch._util import hvd_spawn
from ..torch.test_collectives import _allreduce_all_forms, _gather_bcast_alltoall_rs

pytestmark = pytest.mark.timeout(120)
TORCH = {"UNISON_BACKEND": "torch"}


def test_horovod_layer_on_torch_backend() -> None:
    hvd_spawn(_allreduce_all_forms, 2, env=TORCH, timeout=100)
    # np=3: a rank with nothing pending must answer a peer's negotiation at once on this
    # backend (an idle answer delayed up to a third of UNISON_TIMEOUT made this job 80-90 s)
    hvd_spawn(_gather_bcast_alltoall_rs, 3, env=TORCH, timeout=45)


def test_parameter_server_on_torch_backend() -> None:
    got, _ = run_ps(_init_and_shard, 2, 2, ps.ASP(), split_bytes=1024, env=TORCH)
    assert got[0]["where"] == got[1]["where"]
