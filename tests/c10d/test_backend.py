"""Every torch.distributed call over backend="unison", on real processes, both transports."""

from __future__ import annotations

import pytest

from . import _jobs
from ._util import run, values


@pytest.mark.parametrize(("transport", "size"), [("shm", 3), ("tcp", 4)])
def test_every_call_against_numpy(transport: str, size: int) -> None:
    outs = values(run(_jobs.collectives, size, transport=transport))
    assert all(o["checks"] >= 55 for o in outs), outs
