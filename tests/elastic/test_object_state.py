"""``hvd.elastic.ObjectState`` (Horovod's plain-attribute state) on two real ranks:
``sync`` copies rank 0's attributes to every rank, ``commit`` saves them (a deep copy:
a list changed in place is rolled back too), ``restore`` brings the last commit back,
and ``@hvd.elastic.run`` redoes the failed part from it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.torch._util import hvd_spawn

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)


def _object_state() -> dict[str, Any]:
    import unison.torch as hvd

    r = hvd.rank()
    state = hvd.elastic.ObjectState(epoch=10 * r, items=[r], name=f"rank{r}")
    state.sync()  # rank 0's attributes everywhere, and saved
    synced = (state.epoch, list(state.items), state.name)
    state.items.append(99)
    state.epoch = 5
    state.restore()
    restored = (state.epoch, list(state.items))
    failures = {"left": 1}
    trace: list[int] = []

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> int:
        while state.epoch < 4:
            trace.append(state.epoch)
            state.items.append(state.epoch)
            if state.epoch == 2 and failures["left"]:
                failures["left"] -= 1
                raise hvd.HorovodInternalError("simulated failure")
            state.epoch += 1
            state.commit()
        return state.epoch

    last = train(state)
    return {
        "synced": synced,
        "restored": restored,
        "trace": trace,
        "items": state.items,
        "last": last,
    }


def test_object_state_sync_commit_restore_and_run() -> None:
    for out in hvd_spawn(_object_state, 2):
        assert out["synced"] == (0, [0], "rank0"), out
        assert out["restored"] == (0, [0]), out  # the in-place append was rolled back too
        assert out["trace"] == [0, 1, 2, 2, 3], out  # epoch 2 redone from the last commit
        assert out["items"] == [0, 0, 1, 2, 3] and out["last"] == 4, out
