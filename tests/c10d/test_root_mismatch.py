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


def _pairs_disagree(kind: str, tries: int) -> list[tuple[str, str, bool, str]]:
    """Ranks 0 and 1 root the call at 0, ranks 2 and 3 at 2 (each pair agrees within
    itself); repeated on fresh groups, as a mismatch leaves its group unusable."""
    rank, size = init(timeout=60.0)
    root = 0 if rank < 2 else 2
    out = []
    for _ in range(tries):
        g = dist.new_group(list(range(size)))
        x = torch.full((8,), float(rank + 1))
        try:
            if kind == "gather":
                bufs = [torch.empty(8) for _ in range(size)] if rank == root else None
                dist.gather(x, bufs, dst=root, group=g)
            else:
                dist.reduce(x, dst=root, group=g)
        except Exception as exc:
            out.append(
                (type(exc).__name__, str(exc), isinstance(exc, unison.MismatchError), exc.op)  # type: ignore[attr-defined]
            )
            continue
        raise AssertionError("no error raised")
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["gather", "reduce"])
def test_root_mismatch_between_agreeing_pairs_fails_fast_on_every_rank(kind: str) -> None:
    """4 ranks, two pairs with two roots: a mismatch naming the call on every rank."""
    start = time.monotonic()
    outs = values(run(_pairs_disagree, 4, args=(kind, 4), timeout=120))
    assert time.monotonic() - start < 50, "found only by the 60 s deadline"
    for per_rank in outs:
        for name, text, is_mismatch, op in per_rank:
            assert name == "DistMismatchError" and is_mismatch and op == kind, (name, op, text)
            assert f"mismatched collective at {kind} #" in text, text
            assert "root=0" in text and "root=2" in text, text
