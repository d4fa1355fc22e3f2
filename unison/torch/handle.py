"""Handles of operations submitted to the engine, and the entries the engine keeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .negotiation import Request

__all__ = ["Entry", "Handle"]


class Handle:
    """An operation in flight: ``poll()`` never blocks; ``wait()`` returns its result."""

    __slots__ = ("_error", "_event", "_result", "keep", "name", "source")

    def __init__(self, name: str, keep: Any = None, source: Any = None) -> None:
        self.name = name
        self.keep = keep  # tensors that must outlive the operation
        self.source = source  # the engine: says which ranks have not submitted it
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        if self._event.is_set():
            return
        self._result, self._error = result, error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None, stalled: Callable[[], str] | None = None) -> Any:
        """The result; ``timeout`` None waits as long as the engine lives (it fails the
        handle when a peer is lost)."""
        from .errors import HorovodInternalError

        if timeout is None:
            self._event.wait()
        deadline = time.monotonic() + (timeout or 0.0)
        while not self._event.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                missing: list[int] = []
                if self.source is not None:
                    why = self.source.describe_stall(self.name)
                    missing = self.source.missing_ranks(self.name) or []
                else:
                    why = stalled() if stalled is not None else "it has not finished"
                raise HorovodInternalError(
                    f"{self.name!r} did not complete within {timeout:g}s (UNISON_TIMEOUT): {why}",
                    op=self.name,
                    ranks=missing,
                )
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"<Handle {self.name} {'done' if self.done() else 'pending'}>"


@dataclass
class Entry:
    """One submitted operation on this rank: its request, tensors and handle."""

    request: Request
    inputs: list[Any]
    outputs: list[Any] | None
    handle: Handle
    finish: Callable[[Entry, Any], Any]  # builds the handle's result from execution output
    enqueued: float = field(default_factory=time.perf_counter)
    announced: bool = False
    decided: float = 0.0
