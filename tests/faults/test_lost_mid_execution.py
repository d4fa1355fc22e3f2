"""A rank lost while the survivors execute an agreed unison.torch collective.

Negotiation is over (every rank submitted the tensor), the data collective is handed
to the native engine, and one rank dies as it starts its part. The survivors' handles
must fail at once with a HorovodInternalError naming the operation and the lost rank,
never wait for UNISON_TIMEOUT (60 s here; the job is killed at 30 s, so a hang fails)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from unison.testing import run_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(40)
VICTIM = 2


def _victim_dies_in_data_op(
    n: int, fused: bool = False
) -> tuple[float, str, str | None, tuple[int, ...]]:
    import unison.torch as hvd
    from unison import world
    from unison.horovod.errors import HorovodInternalError

    torch.set_num_threads(1)
    hvd.init()
    t = torch.arange(n, dtype=torch.float32) * (hvd.rank() + 1)
    out = hvd.broadcast(t, 0, name="warm")
    assert torch.equal(out, torch.arange(n, dtype=torch.float32))  # rank 0's data
    if hvd.rank() == VICTIM:

        def die(*_: Any) -> None:  # at its next data collective, after negotiation
            os.kill(os.getpid(), signal.SIGKILL)

        world.current().op_hook = die  # type: ignore[attr-defined]
    start = time.monotonic()
    try:
        for i in range(3):
            if fused:  # one batch of three, reduced where the tensors lie (shared memory)
                hvd.grouped_allreduce([t, t + 1, t + 2], name=f"step{i}")
            else:
                hvd.broadcast(t, 0, name=f"step{i}")
    except HorovodInternalError as exc:
        return time.monotonic() - start, str(exc), exc.op, tuple(exc.ranks)
    raise AssertionError("no failure seen")


@pytest.mark.parametrize(
    ("n", "fused"), [(4, False), (1 << 16, False), (1 << 16, True)], ids=["small", "large", "fused"]
)
def test_rank_lost_in_agreed_collective_fails_survivors_at_once(n: int, fused: bool) -> None:
    outs = run_ranks(
        _victim_dies_in_data_op, 3, args=(n, fused), timeout=30, env={"UNISON_TIMEOUT": "60"}
    )
    assert outs[VICTIM].exitcode == -signal.SIGKILL, outs[VICTIM].describe()
    for o in outs[:VICTIM]:
        assert o.ok, o.describe()  # a survivor still waiting at 30 s is killed: not ok
        took, text, op, ranks = o.value
        assert took < 20, o.value  # far from the 60 s deadline (not a speed check)
        assert "step0" in text and op == "step0", o.value
        # the lost rank, or the survivor whose abort said so (its text names the lost one)
        assert f"rank {VICTIM}" in text and "lost" in text and ranks, o.value
