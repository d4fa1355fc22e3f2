"""``recv(src=None)``: receive from whichever rank of the group sends first.

The transport matches the receive (:data:`unison.transport.matching.ANY_SOURCE`):
the message that arrived first is taken, messages of one sender stay in order, and
the Work's ``_source_rank()`` is the sender's group rank (what ``dist.recv``
returns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._pg import UnisonProcessGroup
    from ._work import UnisonWork

__all__ = ["recv_anysource"]


def recv_anysource(pg: UnisonProcessGroup, tensors: list[torch.Tensor], tag: int) -> UnisonWork:
    from ._pg import HostStage

    st = HostStage()
    b = st(tensors[0])
    part = pg.start_op(pg.comm.irecv, b, None, tag)
    assert part is not None

    def source() -> int:
        return pg.global_ranks.index(part.source if part.source is not None else -1)

    return pg.work_for("recv", [part], list(tensors), st, source)
