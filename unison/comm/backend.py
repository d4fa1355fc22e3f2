"""The seam between the shared layer and the engine that moves bytes.

:mod:`unison.comm.collectives` validates every argument once and then hands
*validated* buffers to the group's :class:`Backend`: one method per collective and
per p2p direction, each returning a :class:`~unison.comm.work.Work`. The native
engine (unison's own transports and algorithms) is the default; the ``mpi`` and
``torch`` backends run every operation on mpi4py or torch.distributed.

A backend sees group ranks for roots, global ranks for p2p peers and flat numpy
views (:class:`unison.buffers.Buffer`) for buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._types import ReduceOp
from ..buffers import Buffer
from .work import Work

if TYPE_CHECKING:
    from .group import Group

__all__ = ["Backend"]


class Backend(Protocol):
    """What an engine implements; every argument has been validated already.

    Every method returns a :class:`Work`; the shared layer (:func:`collectives.issue`)
    starts it and decides once whether to return it or wait on it.
    """

    name: str
    #: whether whole-buffer collectives may pass device (GPU) tensors through
    accepts_device_buffers: bool
    #: whether the engine itself detects ranks that disagree on an operation (native:
    #: signatures ride in every frame); if not, the shared layer agrees first
    checks_signatures: bool

    def broadcast(self, comm: Group, b: Buffer, root: int) -> Work:
        """Copy group rank ``root``'s ``b`` into every rank's ``b``."""

    def all_reduce(self, comm: Group, b: Buffer, op: ReduceOp) -> Work:
        """Reduce ``b`` in place over the group."""

    def reduce(self, comm: Group, b: Buffer, root: int, op: ReduceOp) -> Work:
        """Reduce ``b`` into group rank ``root``'s ``b``; others stay unchanged."""

    def all_gather(self, comm: Group, b: Buffer, outs: list[np.ndarray], result: Any) -> Work:
        """``outs[i]`` gets group rank i's ``b`` on every rank."""

    def gather(
        self,
        comm: Group,
        b: Buffer,
        outs: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        """``outs[i]`` on ``root`` gets group rank i's ``b`` (``outs`` is None elsewhere)."""

    def scatter(
        self,
        comm: Group,
        b: Buffer,
        ins: list[np.ndarray] | None,
        root: int,
    ) -> Work:
        """Group rank i's ``b`` gets ``ins[i]`` from ``root``."""

    def reduce_scatter(
        self,
        comm: Group,
        out: Buffer,
        ins: list[np.ndarray],
        op: ReduceOp,
    ) -> Work:
        """Group rank i's ``out`` gets the reduction of every rank's ``ins[i]``."""

    def all_to_all(
        self,
        comm: Group,
        outs: list[np.ndarray],
        ins: list[np.ndarray],
        result: Any,
        ref: Buffer | None = None,
    ) -> Work:
        """``ins[j]`` goes to group rank j, which receives it into its ``outs[me]``."""

    def barrier(self, comm: Group) -> Work:
        """Return when every member has entered."""

    def isend(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        """Start sending ``b`` to global rank ``peer``."""

    def irecv(self, comm: Group, b: Buffer, peer: int, tag: int) -> Work:
        """Start receiving from global rank ``peer`` into ``b``."""

    def new_group(self, gid: int, ranks: Sequence[int], timeout: float) -> None:
        """Make the engine's communicator for group ``gid`` (collective over the world),
        whose operations end by ``timeout`` seconds."""

    def close(self) -> None:
        """Release the engine's resources (communicators, process groups)."""
