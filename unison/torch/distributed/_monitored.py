"""``monitored_barrier`` with torch's semantics and messages (Gloo's, which torch names).

torch.distributed's own ``dist.monitored_barrier`` refuses every backend but Gloo
before it reaches the process group (it compares the group's backend name with
"gloo"). Importing ``unison.torch.distributed`` therefore extends torch's public
function (:func:`install`): on a group of the backend "unison" it runs unison's
monitored barrier below, on any other group it is torch's own function, unchanged.
``unison.torch.distributed.monitored_barrier(group=None, timeout=None,
wait_all_ranks=False)`` is the same function. Group rank 0 waits for every other
rank; a rank that does not arrive in time is named: ``[Rank 0]: Rank 1 failed to pass
monitoredBarrier in 2000 ms`` (with ``wait_all_ranks=True``: ``Ranks 1, 2 failed
...``); when rank 0's own time runs out before it has heard from every rank, it says
``Rank 0 timed out in monitoredBarrier after ... ms`` and which ranks it did hear from.
"""

from __future__ import annotations

import functools
import itertools
import re
import time
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...errors import CommunicationError

if TYPE_CHECKING:
    from ._pg import UnisonProcessGroup

__all__ = ["install", "monitored_barrier"]

_TAG_BASE = 0xF0000000
_TAG_TEXT = re.compile(r" \(tag \d+\)")
_COUNTS: dict[int, itertools.count[int]] = {}


def _seconds(timeout: Any) -> float:
    """torch's reading of the argument: None is torch's default group timeout, a float
    is seconds (torch warns), a timedelta is itself."""
    if timeout is None:
        timeout = dist.constants.default_pg_timeout
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    warnings.warn(
        "Please pass monitored_barrier's timeout as a datetime.timedelta; "
        f"{timeout!r} is read as seconds",
        stacklevel=3,
    )
    return float(timeout)


def _original(exc: BaseException) -> str:
    """unison's message, without the barrier's internal message tag."""
    return _TAG_TEXT.sub("", str(exc))


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """Barrier that names the ranks that did not arrive within ``timeout``."""
    from ._pg import UnisonProcessGroup

    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, UnisonProcessGroup):
        _TORCH["monitored_barrier"](group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
        return
    run(pg, timeout, wait_all_ranks)


def run(pg: UnisonProcessGroup, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """The monitored barrier on the unison group ``pg`` (its ``monitored_barrier``)."""
    secs = _seconds(timeout)
    comm = pg.comm
    count = _COUNTS.setdefault(id(comm), itertools.count())
    tag = _TAG_BASE + (next(count) % 0x0FFFFFFF)
    me, root = comm.global_rank, pg.global_ranks[0]
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
    for r in pg.global_ranks[1:]:
        buf = torch.zeros(1, dtype=torch.uint8)
        works.append((pg.global_ranks.index(r), comm.irecv(buf, r, tag)))
    failed: list[int] = []
    arrived: list[int] = []
    for grank, w in works:
        if wait_all_ranks:
            left = secs
        else:
            left = secs - (time.monotonic() - start)
            if left < 0 and not w.is_completed():
                heard = ", ".join(map(str, arrived)) if arrived else "none"
                raise dist.DistBackendError(
                    f"[Rank 0]: Rank 0 timed out in monitoredBarrier after {ms} ms "
                    f"(ranks that had arrived: {heard})"
                )
        try:
            w.wait(max(left, 0.0))
        except CommunicationError as exc:
            if not wait_all_ranks:
                raise dist.DistBackendError(
                    f"[Rank 0]: Rank {grank} failed to pass monitoredBarrier in {ms} ms\n"
                    f" Original exception: \n{_original(exc)}"
                ) from None
            failed.append(grank)
        else:
            arrived.append(grank)
    if failed:
        raise dist.DistBackendError(
            f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier "
            f"in {ms} ms"
        )
    for grank, r in enumerate(pg.global_ranks[1:], start=1):
        rel = torch.ones(1, dtype=torch.uint8)
        try:
            comm.isend(rel, r, tag).wait(secs)
        except CommunicationError as exc:
            raise dist.DistBackendError(
                f"[Rank 0]: Rank {grank} failed to pass monitoredBarrier in {ms} ms\n"
                f" Original exception: \n{_original(exc)}"
            ) from None


#: torch's own function, kept for the groups of other backends
_TORCH: dict[str, Any] = {}


def install() -> None:
    """Extend torch's ``dist.monitored_barrier`` to unison's groups (once)."""
    import torch.distributed.distributed_c10d as c10d

    if "monitored_barrier" in _TORCH:
        return
    theirs = c10d.monitored_barrier
    _TORCH["monitored_barrier"] = theirs

    @functools.wraps(theirs)
    def extended(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        monitored_barrier(group, timeout, wait_all_ranks)

    c10d.monitored_barrier = extended
    dist.monitored_barrier = extended
