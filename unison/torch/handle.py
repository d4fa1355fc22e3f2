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

    __slots__ = ("_error", "_event", "_result", "keep", "name")

    def __init__(self, name: str, keep: Any = None) -> None:
        self.name = name
        self.keep = keep  # tensors that must outlive the operation
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

    def wait(self, timeout: float, stalled: Callable[[], str]) -> Any:
        from .errors import HorovodInternalError

        deadline = time.monotonic() + timeout
        while not self._event.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise HorovodInternalError(
                    f"{self.name!r} did not complete within {timeout:g}s (UNISON_TIMEOUT); "
                    f"{stalled()}",
                    op=self.name,
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
