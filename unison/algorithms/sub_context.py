"""A collective's phase on a subset of its ranks (hierarchical algorithms).

:class:`SubContext` runs any schedule written for an :class:`~._context.OpContext`
among some of the operation's ranks: same group, sequence number, signature and
deadline, its own group-rank numbering, and a distinct ``tag_base`` so phases among
the same peers never share a key. Its requests are tracked by the parent, so an
abort (peer lost, remote failure) or a withdrawal reaches them as it reaches the
parent's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import CommunicationError
from ..transport.request import Request
from ._context import OpContext

__all__ = ["SubContext"]


class SubContext(OpContext):
    def __init__(self, parent: OpContext, members: Sequence[int], tag_base: int) -> None:
        """``members``: group ranks of ``parent`` (the parent's own rank among them)."""
        super().__init__(
            parent.router,
            op=parent.op,
            group_id=parent.group_id,
            seq=parent.seq,
            ranks=[parent.ranks[m] for m in members],
            rank=list(members).index(parent.rank),
            sig=parent.sig,
            deadline=parent.deadline,
            timeout=parent.timeout,
            segment_bytes=parent.segment_bytes,
            tag_base=parent.tag_base + tag_base,
            topo=parent.topo,
        )
        self.parent = parent
        self.diagnose = parent.diagnose
        self.round_barrier = parent.round_barrier

    def track(self, req: Request) -> Request:
        return self.parent.track(req)

    def raise_if_aborted(self) -> None:
        self.parent.raise_if_aborted()

    def reset_pending(self) -> None:
        self.parent.reset_pending()

    def wait(self, *reqs: Request) -> None:
        try:
            super().wait(*reqs)
        except CommunicationError:
            aborted = self.parent.aborted
            if aborted is not None:  # the root cause beats its consequences
                raise aborted from None
            raise
