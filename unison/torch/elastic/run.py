"""``elastic.run``: retry a training function from the last committed state."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .state import State

__all__ = ["run"]

log = logging.getLogger("unison.torch.elastic")
F = TypeVar("F", bound=Callable[..., Any])
_MAX_RESETS = 100


def run(func: F) -> F:
    """Decorate ``func(state, *args, **kwargs)`` so a recoverable failure restores
    ``state`` to its last commit and calls ``func`` again."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        resets = 0
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                resets += 1
                if resets > _MAX_RESETS:
                    raise
                log.warning("recoverable failure, restoring the last commit: %s", exc)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            state.on_reset()

    return wrapper  # type: ignore[return-value]
