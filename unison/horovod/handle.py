"""Handles of operations submitted to the engine, and the entries the engine keeps.

:class:`Handle` is unison's one future type (:class:`unison.comm.work.Work`) with
Horovod's surface on top: ``poll`` (``done``) never blocks, and ``synchronize``
(``wait``) returns the operation's output -- the tensor, a list for grouped
operations, a pair for alltoall -- where a plain Work's ``wait`` returns True.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..comm.work import Work
from .negotiation import TensorRequest

__all__ = ["Entry", "Handle"]


class Handle(Work):
    """An operation in flight: ``done()`` never blocks; ``wait()`` returns its result."""

    def __init__(self, name: str, keep: Any = None, engine: Any = None) -> None:
        super().__init__(name)
        self.keep = keep  # tensors that must outlive the operation
        self.engine = engine  # says which ranks have not submitted it
        #: the caller has seen it finish (``done()`` said True) or waited for it
        self.collected = False
        #: when it finished (time.perf_counter), once it has
        self.finished_at = 0.0

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        if not self.finished:
            self.finished_at = time.perf_counter()
        super().finish(result, error)

    def done(self) -> bool:
        if self.finished:
            self.collected = True
            return True
        return False

    def wait(self, timeout: float | None = None, stalled: Callable[[], str] | None = None) -> Any:
        """The result; ``timeout`` None waits as long as the engine lives (it fails the
        handle when a peer is lost). Past ``timeout``: Horovod's HorovodInternalError
        naming the ranks that have not submitted the operation."""
        from .errors import HorovodInternalError

        self.collected = True
        if timeout is None:
            self._wait_done(None)
        deadline = time.monotonic() + (timeout or 0.0)
        while not self._wait_done(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                missing: list[int] = []
                if self.engine is not None:
                    why = self.engine.describe_stall(self.name)
                    missing = self.engine.missing_ranks(self.name) or []
                else:
                    why = stalled() if stalled is not None else "it has not finished"
                raise HorovodInternalError(
                    f"{self.name!r} did not complete within {timeout:g}s (UNISON_TIMEOUT): {why}",
                    op=self.name,
                    ranks=missing,
                )
        error = self.exception()
        if error is not None:
            raise error
        return self._result

    def result(self) -> Any:
        return self.wait()

    def __repr__(self) -> str:
        return f"<Handle {self.name} {'done' if self.done() else 'pending'}>"


@dataclass
class Entry:
    """One submitted operation on this rank: its request, tensors and handle."""

    request: TensorRequest
    inputs: list[Any]
    outputs: list[Any] | None
    handle: Handle
    finish: Callable[[Entry, Any], Any]  # builds the handle's result from execution output
    enqueued: float = field(default_factory=time.perf_counter)
    announced: bool = False
    decided: float = 0.0
