"""Through torch.distributed on the "unison" backend: ranks that each believe they are
the root of a gather or reduce fail fast with a mismatch naming the op on every rank
(they waited out the deadline, then blamed a live rank)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import unison

from ._jobs import init
from ._util import run, values


def _each_its_own_root(kind: str) -> tuple[str, str, bool]:
    rank, size = init(timeout=60.0)
    x = torch.full((1000,), float(rank + 1))
    try:
        if kind == "gather":
            dist.gather(x, [torch.empty(1000) for _ in range(size)], dst=rank)
        else:
            dist.reduce(x, dst=rank)
    except Exception as exc:
        return type(exc).__name__, str(exc), isinstance(exc, unison.MismatchError)
    raise AssertionError("no error raised")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["gather", "reduce"])
@pytest.mark.parametrize("p", [2, 3])
def test_root_mismatch_fails_fast_on_every_rank(p: int, kind: str) -> None:
    start = time.monotonic()
    outs = values(run(_each_its_own_root, p, args=(kind,), timeout=120))
    assert time.monotonic() - start < 50, "found only by the 60 s deadline"
    for name, text, is_mismatch in outs:
        assert name == "DistMismatchError" and is_mismatch, (name, text)
        assert f"mismatched collective at {kind}" in text and "root=" in text, text
