"""``monitored_barrier`` with torch's semantics and messages (Gloo's, which torch names).

torch.distributed's own ``dist.monitored_barrier`` refuses every backend but Gloo
before it reaches the process group, so unison offers the function itself:
``unison.torch.distributed.monitored_barrier(group=None, timeout=None,
wait_all_ranks=False)``. Group rank 0 waits for every other rank; a rank that does
not arrive in time is named: ``[Rank 0]: Rank 1 failed to pass monitoredBarrier in
2000 ms`` (with ``wait_all_ranks=True``: ``Ranks 1, 2 failed ...``).
"""

from __future__ import annotations

import itertools
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...errors import CommunicationError

if TYPE_CHECKING:
    from ._pg import UnisonProcessGroup

__all__ = ["monitored_barrier"]

_TAG_BASE = 0xF0000000
_TAG_TEXT = re.compile(r" \(tag \d+\)")
_COUNTS: dict[int, itertools.count[int]] = {}


def _seconds(pg: UnisonProcessGroup, timeout: Any) -> float:
    if timeout is None:
        return float(pg._comm.config.timeout)
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _original(exc: BaseException) -> str:
    """unison's message, without the barrier's internal message tag."""
    return _TAG_TEXT.sub("", str(exc))


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """Barrier that names the ranks that did not arrive within ``timeout``."""
    from ._pg import UnisonProcessGroup

    pg = group if isinstance(group, UnisonProcessGroup) else None
    if pg is None:
        resolved = dist.group.WORLD if group is None else group
        if not isinstance(resolved, UnisonProcessGroup):
            dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
            return
        pg = resolved
    secs = _seconds(pg, timeout)
    comm = pg._comm
    count = _COUNTS.setdefault(id(comm), itertools.count())
    tag = _TAG_BASE + (next(count) % 0x0FFFFFFF)
    me, root = comm.global_rank, pg._ranks[0]
    ms = int(secs * 1000)
    if me != root:
        out = torch.zeros(1, dtype=torch.uint8)
        got = torch.zeros(1, dtype=torch.uint8)
        try:  # as Gloo: the send and the receive fail alike (rank 0 gone, or late)
            comm.isend(out, root, tag).wait(secs)
            comm.irecv(got, root, tag).wait(secs)
        except CommunicationError as exc:
            raise dist.DistBackendError(
                f"Rank {pg.rank()} successfully reached monitoredBarrier, but received errors "
                f"while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                f"rank.\n Original exception: \n{_original(exc)}"
            ) from None
        return
    start = time.monotonic()
    works = []
    for r in pg._ranks[1:]:
        buf = torch.zeros(1, dtype=torch.uint8)
        works.append((pg._ranks.index(r), comm.irecv(buf, r, tag)))
    failed: list[int] = []
    for grank, w in works:
        left = secs if wait_all_ranks else max(secs - (time.monotonic() - start), 0.0)
        try:
            w.wait(left)
        except CommunicationError as exc:
            if not wait_all_ranks:
                raise dist.DistBackendError(
                    f"[Rank 0]: Rank {grank} failed to pass monitoredBarrier in {ms} ms\n"
                    f" Original exception: \n{_original(exc)}"
                ) from None
            failed.append(grank)
    if failed:
        raise dist.DistBackendError(
            f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier "
            f"in {ms} ms"
        )
    for grank, r in enumerate(pg._ranks[1:], start=1):
        rel = torch.ones(1, dtype=torch.uint8)
        try:
            comm.isend(rel, r, tag).wait(secs)
        except CommunicationError as exc:
            raise dist.DistBackendError(
                f"[Rank 0]: Rank {grank} failed to pass monitoredBarrier in {ms} ms\n"
                f" Original exception: \n{_original(exc)}"
            ) from None
