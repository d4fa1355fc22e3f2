"""Consistency policies: when a pull may be served and when a push may be applied.

A policy is a pure function of per-worker clocks. Each worker counts its steps with
``kv.clock()`` (0 at the start); every push and pull carries the worker's current
clock. The server keeps the clock of every worker it serves and asks the policy two
questions, with ``slowest`` the smallest clock among the workers still in the job
(:data:`DONE` when none is):

``pull_ready(clock, slowest)``
    may a pull made at ``clock`` be answered now? If not, the server holds it until
    clocks advance (or its deadline passes).
``apply_ready(clock, slowest)``
    may a push made at ``clock`` be applied to the parameters now? If not, the
    server keeps it, and applies every held push of one clock together (summed, in
    worker order) once the policy allows it.

Server and worker code only ever call these two methods; they never ask which
policy they have.

* :class:`SSP` ``(s)`` (Ho et al., NIPS 2013): a pull at clock c waits while the
  slowest worker is behind c − s, so it sees every push up to clock c − s − 1, and
  (for s > 0) whatever newer pushes have already arrived (including the worker's own).
* :class:`BSP` is ``SSP(0)``: a pull at clock c waits until every worker has
  finished clock c − 1. With no staleness allowed, no reader can use an update of
  clock c before every worker has finished c, so the updates of a clock are held
  and applied together: a pull sees exactly the pushes up to c − 1, which is
  synchronous SGD. ``SSP(0) == BSP()``.
* :class:`ASP`: never waits; a pull sees whatever has been applied.
"""

from __future__ import annotations

import abc

from ..errors import InvalidArgumentError

__all__ = ["ASP", "BSP", "DONE", "SSP", "Consistency", "from_key"]

#: the clock of a worker that has left the job: never holds anyone back
DONE = 1 << 62


class Consistency(abc.ABC):
    """The one interface of every consistency policy."""

    @abc.abstractmethod
    def pull_ready(self, clock: int, slowest: int) -> bool:
        """Whether a pull made at ``clock`` may be answered while the slowest is at ``slowest``."""

    @abc.abstractmethod
    def apply_ready(self, clock: int, slowest: int) -> bool:
        """Whether a push made at ``clock`` may be applied while the slowest is at ``slowest``."""

    @abc.abstractmethod
    def key(self) -> tuple[str, int]:
        """A value that identifies the behaviour (equal keys, equal behaviour)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Consistency) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


class SSP(Consistency):
    """Stale-synchronous parallel: the fastest worker runs at most ``staleness`` clocks ahead."""

    def __init__(self, staleness: int) -> None:
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise InvalidArgumentError(f"SSP staleness must be an int >= 0, got {staleness!r}")
        self.staleness = staleness

    def pull_ready(self, clock: int, slowest: int) -> bool:
        return slowest >= clock - self.staleness

    def apply_ready(self, clock: int, slowest: int) -> bool:
        return self.staleness > 0 or slowest > clock

    def key(self) -> tuple[str, int]:
        return ("bounded", self.staleness)

    def __repr__(self) -> str:
        return f"SSP(staleness={self.staleness})"


class BSP(SSP):
    """Bulk-synchronous parallel: a barrier every clock (exactly ``SSP(0)``)."""

    def __init__(self) -> None:
        super().__init__(0)

    def __repr__(self) -> str:
        return "BSP()"


class ASP(Consistency):
    """Asynchronous parallel: nobody waits for anybody."""

    def pull_ready(self, clock: int, slowest: int) -> bool:
        return True

    def apply_ready(self, clock: int, slowest: int) -> bool:
        return True

    def key(self) -> tuple[str, int]:
        return ("async", 0)

    def __repr__(self) -> str:
        return "ASP()"


def from_key(key: tuple[str, int]) -> Consistency:
    """The policy whose :meth:`Consistency.key` is ``key``."""
    kind, s = key
    if kind == "async":
        return ASP()
    if kind == "bounded":
        return BSP() if s == 0 else SSP(int(s))
    raise InvalidArgumentError(f"unknown consistency {key!r}")
