"""The seam between the shared layer and the engine that moves bytes.

:mod:`unison.comm.collectives` validates every argument once and then hands
*validated* buffers to the group's :class:`Backend`: one method per collective and
per p2p direction, each returning a :class:`~unison.comm.work.Work`. The native
engine (unison's own transports and algorithms) is the default; the ``mpi`` and
``torch`` backends run every operation on mpi4py or torch.distributed.

A backend sees group ranks for roots, global ranks for p2p peers and flat numpy
views (:class:`unison.buffers.Buffer`) for buffers.

An engine may also give a group an optional fast entry, :class:`CallerThreadCollectives`,
when it makes the group: blocking small collectives it runs in the caller's thread
(no Work, no queue). The shared layer validates a call's signature once, asks the
entry to :meth:`~CallerThreadCollectives.prepare` it, keeps the prepared call by
signature (:class:`CallerThread`) and later calls
:meth:`~CallerThreadCollectives.run` straight away; either may decline, and the call
then takes the Backend method like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._types import OpCode, ReduceOp
from ..buffers import Buffer, DType
from .work import Work

if TYPE_CHECKING:
    from .group import Group

__all__ = ["Backend", "CallerThread", "CallerThreadCollectives"]


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

    def all_reduce_pieces(
        self,
        comm: Group,
        srcs: Sequence[np.ndarray],
        dsts: Sequence[np.ndarray],
        dtype: DType,
        op: ReduceOp,
        finish: Callable[[np.ndarray], None] | None,
    ) -> Work | None:
        """Reduce the arrays ``srcs`` (laid end to end) over the group as one buffer
        into ``dsts`` (``dsts[i]`` may be ``srcs[i]``), where they lie; ``finish`` runs
        in place on the result. None where the engine cannot for this group and size
        without packing the arrays into one buffer (or they share memory:
        :func:`unison.buffers.pieces.pieces_pair`): the caller then does that."""

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


class CallerThreadCollectives(Protocol):
    """An engine's blocking small collectives in the caller's thread (optional).

    ``prepare`` gets a signature the shared layer has validated and returns the
    engine's prepared call, or None when its path does not take such calls (too large,
    an algorithm forced...): the same answer on every rank for one signature. ``run``
    runs a prepared call now, or returns False having done nothing (something else of
    the group is in flight, the group failed): the caller then takes the Backend path.
    """

    def prepare(
        self,
        op: OpCode,
        arr: np.ndarray,
        nbytes: int,
        dtype: DType,
        redop: ReduceOp | None = None,
        root: int = -1,
        gather_list: bool = False,
    ) -> object | None:
        """A call of ``op`` on buffers shaped as ``arr`` (all_reduce, broadcast: the
        data; all_gather: the input; reduce_scatter: the output), ``nbytes`` on the
        wire, reduced by ``redop``, rooted at global rank ``root``; ``gather_list``:
        all_gather into a list of blocks."""

    def run(self, call: object, inp: Any, out: Any) -> bool:
        """Run ``call`` (from :meth:`prepare`) on ``inp`` into ``out``; False: declined."""


class CallerThread:
    """A group's :class:`CallerThreadCollectives` and the calls prepared for it, by
    signature: a signature found here was validated when it was prepared, so the
    shared layer checks only what can change between calls of one signature."""

    __slots__ = ("calls", "entry", "every_collective", "run")

    def __init__(self, entry: CallerThreadCollectives, every_collective: bool = True) -> None:
        self.entry = entry
        #: whether the entry takes every kind of small collective (False: some only, e.g.
        #: the all-reduce of a group without shared slots)
        self.every_collective = every_collective
        #: ``entry.run`` (one attribute load on the hot path)
        self.run = entry.run
        #: signature -> the prepared call (None: the entry does not take it)
        self.calls: dict[tuple[Any, ...], object | None] = {}

    def prepared(
        self,
        key: tuple[Any, ...],
        op: OpCode,
        arr: np.ndarray,
        nbytes: int,
        dtype: DType,
        redop: ReduceOp | None = None,
        root: int = -1,
        gather_list: bool = False,
    ) -> object | None:
        """The prepared call of a validated signature ``key`` (made on first use)."""
        calls = self.calls
        if key in calls:
            return calls[key]
        if len(calls) > 512:
            calls.clear()
        call = calls[key] = self.entry.prepare(op, arr, nbytes, dtype, redop, root, gather_list)
        return call
