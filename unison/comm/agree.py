"""Before an engine is called: refuse a group left in an unknown state, and make the
ranks agree on the operation's signature where the engine does not check it itself.

The native engine carries every operation's signature (op, dtype, count, reduce op,
root) in its frames and aborts on every rank when they disagree. External engines
(``mpi``, ``torch``) do not: Gloo aborts the process on a count mismatch, MPI fails
on one rank and leaves the others waiting. So for them the shared layer first
gathers every rank's signature over the engine itself (a 5-integer all-gather) and
raises :class:`MismatchError` on every rank, naming what each rank called, before
the engine sees the operation. ``UNISON_CHECK_MISMATCH=0`` turns this off.

A group whose operation failed in a way that may leave the engine's state unknown
(a timeout, an engine error) is *broken*: every later call on it raises
:class:`AbortedError` instead of running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._types import OpCode, OpSig
from ..algorithms import describe
from ..buffers import Buffer, DType
from ..errors import AbortedError, CollectiveTimeoutError, CommunicationError, MismatchError

if TYPE_CHECKING:
    from .group import Group

__all__ = ["agree", "guard"]


def guard(
    comm: Group, op: OpCode, dtype: int = 0, count: int = 0, redop: int = 0, root: int = -1
) -> None:
    """Raise if ``comm`` is broken; on engines that need it, agree on the signature.

    ``root`` is a global rank (-1: none)."""
    broken = comm.broken
    if broken is not None:
        raise AbortedError(
            f"{op.label} refused: group {comm.id} is unusable since an earlier failure: {broken}",
            op=op.label,
            group=comm.id,
            ranks=getattr(broken, "ranks", ()),
        )
    if comm.backend.checks_signatures or comm.size == 1 or not comm.config.check_mismatch:
        return
    agree(comm, OpSig(int(op), int(dtype), int(redop), int(root), int(count)))


def agree(comm: Group, sig: OpSig) -> None:
    """Gather every member's ``sig`` over the group's engine; raise :class:`MismatchError`
    on every rank if they differ (each rank sees the same table)."""
    what = OpCode(sig.op).label
    name = f"{what} (group {comm.id}, {comm.backend.name})"
    mine = np.array(sig, np.int64)
    table = np.empty((comm.size, len(sig)), np.int64)
    try:
        work = comm.backend.all_gather(comm, Buffer(mine, DType.INT64, mine), list(table), None)
        work.start(caller_waits=True)
        work.wait()
    except CommunicationError as exc:
        comm.mark_broken(exc)  # the gather may still be posted in the engine
        kind = CollectiveTimeoutError if isinstance(exc, CollectiveTimeoutError) else type(exc)
        raise kind(
            f"{name}: the group's ranks did not all enter it ({exc})",
            op=what,
            group=comm.id,
            ranks=exc.ranks,
        ) from None
    rows = [OpSig(*(int(v) for v in row)) for row in table]
    if all(r == rows[0] for r in rows):
        return
    me = comm.rank
    assert me is not None
    differ = tuple(comm.ranks[i] for i, r in enumerate(rows) if r != rows[me])
    calls = "; ".join(f"rank {comm.ranks[i]} called {describe(r)}" for i, r in enumerate(rows))
    raise MismatchError(
        f"{name}: mismatch between the group's ranks, nothing was run: {calls}",
        op=what,
        group=comm.id,
        ranks=differ,
    )
