"""The Horovod API's two groups per process set on one host: the data group, whose large
all-reduces choose the direct shared-memory algorithms, reserves its shared arena; the
negotiation group, which only ever runs small collectives and point-to-point messages,
reserves none (no /dev/shm for it: a 64 MB Docker /dev/shm holds the data arenas)."""

from __future__ import annotations

import os
from typing import Any

from ._util import hvd_spawn, torch

ARENA = 2 << 20


def _arenas() -> list[Any]:
    import unison.torch as hvd
    from unison.torch.basics import engine_of
    from unison.world import current

    rt = current()
    seg = rt.fabric.shm_setup.segment  # type: ignore[attr-defined]
    world_part = rt.fabric.shm_setup.world_part  # type: ignore[attr-defined]
    eng = engine_of(hvd.global_process_set)
    ctl, data = eng.channel.group, eng.runner.group
    for i in range(4):
        hvd.allreduce(torch.ones(3), name=f"small.{i % 2}")
    big = torch.arange(3 << 18, dtype=torch.float32)  # 3 MiB: rounds of the data arena
    got = hvd.allreduce(big, name="big", op=hvd.Sum)
    ok = bool(torch.equal(got, big * hvd.size()))
    allocated = int(os.fstat(seg.fd).st_blocks) * 512 - world_part
    has = [rt.executors[g.id].topo.arena is not None for g in (ctl, data)]
    return [ok, has, allocated]


def test_negotiation_group_reserves_no_arena() -> None:
    outs = hvd_spawn(_arenas, 2, env={"UNISON_GROUP_ARENA_BYTES": str(ARENA)}, timeout=90)
    for r, (ok, has, allocated) in enumerate(outs):
        assert ok, r
        assert has == [False, True], (r, has)
        assert allocated < 2 * ARENA, (r, allocated)  # the data group's part only
