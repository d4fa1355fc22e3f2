"""A group's identity: its id, its ranks, rank translation and the argument checks.

A :class:`Group` (the world or a sub-group, ``unison.Group``) knows who belongs to
it and which :class:`~unison.comm.backend.Backend` runs its operations; it knows
nothing of how an engine runs them. The engine keeps its own per-group state
(the native engine: :mod:`unison.backends.native.executor`; mpi and torch: their
sub-communicators) under the group's :attr:`~Group.id`.

A group whose operation failed in a way that leaves the engine's state unknown is
*broken* (:meth:`Group.mark_broken`): the shared layer refuses later calls on it.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffers import Buffer, as_buffer
from ..errors import InvalidArgumentError
from ..transport.matching import ANY_SOURCE
from .work import Work

if TYPE_CHECKING:
    from ..config import Config
    from .backend import Backend, CallerThread

__all__ = ["ANY_SOURCE", "Group", "check_members", "group_timeout"]

_MAX_TAG = (1 << 32) - 1


def group_timeout(timeout: Any) -> float | None:
    """``new_group``'s ``timeout`` in seconds (a number or a ``timedelta``; None: the job's)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float, np.integer, np.floating)) and not isinstance(
        timeout, bool
    ):
        seconds = float(timeout)
    else:
        raise InvalidArgumentError(
            f"new_group: timeout must be seconds or a datetime.timedelta, got {timeout!r}"
        )
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidArgumentError(
            f"new_group: timeout must be positive and finite, got {timeout!r}"
        )
    return seconds


def check_members(ranks: Sequence[int] | None, size: int) -> list[int]:
    """The sorted global ranks of a new group of a world of ``size`` (None: all)."""
    members = list(range(size)) if ranks is None else [int(r) for r in ranks]
    if not members or len(set(members)) != len(members):
        raise InvalidArgumentError(
            f"new_group: ranks must be distinct and non-empty, got {list(ranks or [])}"
        )
    bad = [r for r in members if not 0 <= r < size]
    if bad:
        raise InvalidArgumentError(f"new_group: ranks {bad} are outside 0..{size - 1}")
    return sorted(members)


class Group:
    """A group of ranks (the world or a sub-group) and the operations on it.

    Exposed publicly as :class:`unison.Group`. ``ranks`` are global ranks in group
    order; ``rank`` is this process's rank in the group (None for a non-member);
    ``global_rank`` is this process's rank in the world. ``config`` is the job's
    configuration, with the group's own ``timeout`` where ``new_group`` was given one.
    """

    def __init__(
        self,
        gid: int,
        ranks: Sequence[int],
        global_rank: int,
        config: Config,
        backend: Backend,
    ) -> None:
        self.id = gid
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.size = len(self.ranks)
        self.global_rank = global_rank
        self.rank: int | None = self.ranks.index(global_rank) if global_rank in self.ranks else None
        self.config = config
        #: the engine that runs this group's operations (chosen once, at init)
        self.backend = backend
        #: the failure that left this group unusable, or None (:meth:`mark_broken`)
        self.broken: BaseException | None = None
        self._lock = threading.Lock()
        #: the engine's entry for blocking small collectives in the caller's thread, or
        #: None; an engine that has one for this group sets it once, when it makes the group
        self.caller_thread: CallerThread | None = None

    @property
    def caller_thread_collectives(self) -> bool:
        """True when the group's engine runs every kind of small blocking collective in
        the caller's thread (no engine thread, no queue between the call and the bytes)."""
        return self.caller_thread is not None and self.caller_thread.every_collective

    def __repr__(self) -> str:
        return f"<unison.Group {self.id} ranks={list(self.ranks)} rank={self.rank}>"

    # --- failure state -------------------------------------------------------------------
    def mark_broken(self, exc: BaseException) -> bool:
        """An operation failed leaving the engine's state unknown: refuse later calls.
        The first failure is kept; True if ``exc`` is it."""
        with self._lock:
            if self.broken is None:
                self.broken = exc
                return True
            return False

    def retire(self, exc: BaseException) -> None:
        """The group's world was shut down: every later call is refused with ``exc``."""
        with self._lock:
            self.broken = exc

    # --- membership ------------------------------------------------------------------------
    def require_member(self, what: str) -> int:
        if self.rank is None:
            raise InvalidArgumentError(
                f"{what}: rank {self.global_rank} is not a member of group {self.id} "
                f"(ranks {list(self.ranks)})"
            )
        return self.rank

    def group_rank(self, rank: int, what: str) -> int:
        """Translate a global rank given as src/dst/root; it must belong to the group."""
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise InvalidArgumentError(f"{what} must be an int rank, got {rank!r}")
        if int(rank) not in self.ranks:
            raise InvalidArgumentError(
                f"{what}={rank} is not a rank of group {self.id} (ranks {list(self.ranks)})"
            )
        return self.ranks.index(int(rank))

    # --- point-to-point ----------------------------------------------------------------------
    def _p2p_args(
        self, buf: Any, peer: int, tag: int, what: str, writable: bool
    ) -> tuple[Buffer, int]:
        """Validate a send/recv once: membership, buffer, peer (a global rank), tag."""
        self.require_member(what)
        b = as_buffer(buf, what, writable=writable)
        self.group_rank(peer, "dst" if what == "send" else "src")
        if int(peer) == self.global_rank:
            raise InvalidArgumentError(f"{what}: rank {peer} cannot {what} to itself")
        if (
            isinstance(tag, bool)
            or not isinstance(tag, (int, np.integer))
            or not 0 <= int(tag) <= _MAX_TAG
        ):
            raise InvalidArgumentError(f"{what}: tag must be an int in [0, 2**32), got {tag!r}")
        return b, int(peer)

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``buf`` to global rank ``dst`` on this group's engine."""
        b, peer = self._p2p_args(buf, dst, tag, "send", writable=False)
        return self.backend.isend(self, b, peer, int(tag))

    def irecv(self, buf: Any, src: int | None, tag: int = 0) -> Work:
        """Start receiving from global rank ``src`` into ``buf`` on this group's engine;
        ``src=None``: from any rank of the group (the Work's ``source`` is the sender)."""
        if src is None:
            anyone = self.ranks[0] if self.global_rank != self.ranks[0] else self.ranks[-1]
            b, _ = self._p2p_args(buf, anyone, tag, "recv", writable=True)
            return self.backend.irecv(self, b, ANY_SOURCE, int(tag))
        b, peer = self._p2p_args(buf, src, tag, "recv", writable=True)
        return self.backend.irecv(self, b, peer, int(tag))
