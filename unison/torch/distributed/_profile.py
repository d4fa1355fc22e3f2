"""torch profiler events for the backend's operations, named ``unison:<op>``.

torch's own backends (``gloo:all_reduce``, ``nccl:send`` ...) record each operation
as an asynchronous event that starts when the operation is issued, ends when it
completes, and carries the input tensors' shapes (with ``record_shapes=True``).
unison's process group records its operations the same way while a torch profiler
(``torch.profiler.profile`` or ``torch.autograd.profiler.profile``) is running;
otherwise the cost is one flag test per call.

The event is ended from another thread than the one that issued the operation, as
torch's backends do (their work completes on their own threads): an operation that
already completed inline is ended by a short-lived thread that the caller joins.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch._C._autograd import _record_function_with_args_enter
from torch.autograd import profiler as _torch_profiler

__all__ = ["recorded"]

F = TypeVar("F", bound=Callable[..., Any])


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in ``x`` (a tensor, or lists of them), in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out: list[torch.Tensor] = []
        for item in x:
            out.extend(_tensors(item))
        return out
    return []


#: ends a record when a future completes, on the completing thread, with the profiler's
#: thread-local state (what torch's backends do for their works)
_end_on = torch.ops.profiler._call_end_callbacks_on_jit_fut


def _start(title: str, inputs: Iterable[torch.Tensor]) -> Any:
    return _record_function_with_args_enter(title, *inputs)


def _end_elsewhere(fut: torch.futures.Future[Any]) -> None:
    t = threading.Thread(target=fut.set_result, args=(None,), name="unison-c10d-profile")
    t.start()
    t.join()


def _end_when_done(record: Any, work: Any) -> None:
    """End ``record`` when ``work`` completes, on a thread other than this one."""
    ender: torch.futures.Future[Any] = torch.futures.Future()
    _end_on(record, ender)
    me = threading.get_ident()

    def done() -> None:
        if threading.get_ident() == me:
            _end_elsewhere(ender)  # finished on this thread (inline, or in its wait)
        else:
            ender.set_result(None)

    work.on_finished(done)  # ended before the work's wait returns


def recorded(op: str, inputs: int | None = 0) -> Callable[[F], F]:
    """Record the decorated process-group method as the event ``unison:<op>``; its
    positional argument ``inputs`` (None: none) holds the tensors whose shapes the
    event carries."""
    title = f"unison:{op}"

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _torch_profiler._is_profiler_enabled:
                return fn(self, *args, **kwargs)
            given = _tensors(args[inputs]) if inputs is not None and len(args) > inputs else []
            record = _start(title, given)
            try:
                work = fn(self, *args, **kwargs)
            except BaseException:
                ender: torch.futures.Future[Any] = torch.futures.Future()
                _end_on(record, ender)
                _end_elsewhere(ender)
                raise
            _end_when_done(record, work)
            return work

        return method  # type: ignore[return-value]

    return deco
