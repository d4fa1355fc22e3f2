"""A rank lost under DDP: every survivor's backward raises an error naming it.

The error reaches DDP through the Work's future; it used to arrive as a
PicklingError (torch pickles what a future carries, and unison's error classes were
made at run time) and, once picklable, as a crash inside backward (a future that
carried the exception as its value). Now the future fails and backward raises
torch's RuntimeError carrying unison's typed message.
"""

from __future__ import annotations

import pickle

import pytest
import torch.distributed as dist

import unison
from unison.torch.distributed import translate

from . import _faults
from ._util import run


def test_dist_errors_pickle_with_their_attributes() -> None:
    cases = [
        unison.PeerLostError("rank 1 was lost", op="all_reduce", seq=4, group=0, ranks=[1]),
        unison.CollectiveTimeoutError("timed out", op="barrier", ranks=[2]),
        unison.MismatchError("dtype differs", op="all_reduce", ranks=[0, 1]),
        unison.AbortedError("rank 2 failed", ranks=[2], remote=True),
        unison.CommunicationError("failed"),
    ]
    for exc in cases:
        dexc = translate(exc)
        back = pickle.loads(pickle.dumps(dexc))
        assert type(back) is type(dexc) and str(back) == str(exc)
        assert isinstance(back, dist.DistBackendError) and isinstance(back, type(exc))
        for name in ("op", "seq", "group", "ranks", "remote"):
            assert getattr(back, name) == getattr(exc, name), name


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "kind,size", [("kill", 2), ("exit", 3), ("stop", 3), ("idle", 2)], ids=lambda x: str(x)
)
def test_lost_rank_under_ddp_is_named_on_every_survivor(kind: str, size: int) -> None:
    timeout = 15.0 if kind in ("kill", "exit") else 6.0
    env = {"UNISON_TIMEOUT": str(timeout)}
    outs = run(_faults.ddp_until_failure, size, args=(kind, timeout), env=env, timeout=150)
    lost = size - 1
    for o in outs[:lost]:
        assert o.ok, o.describe()  # no crash, no silent death
        step, name, text = o.value
        assert step == 5 and name == "RuntimeError", o.value
        assert "PicklingError" not in text, text
        want = "DistPeerLostError" if kind in ("kill", "exit") else "DistCollectiveTimeoutError"
        if size > 2 and "DistAbortedError" in text:
            want = "DistAbortedError"  # told by the survivor that noticed first
        assert want in text and f"rank {lost}" in text, text
