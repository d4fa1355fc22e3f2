"""``elastic.run``: retry a training function from the last committed state.

Horovod's loop: ``state.sync()``, call ``func(state)``; on
:class:`HorovodInternalError` restore the last commit, on
:class:`HostsUpdatedInterrupt` keep the state; then reset and go again. In an
elastic job (``unison run --min-np/--max-np/--host-discovery-script``) the reset
re-forms the world: ``hvd.shutdown()``, then ``hvd.init()`` joins the driver's next
round (new ranks and size, same store), ``state.on_reset()`` runs the reset
callbacks and ``state.sync()`` copies rank 0's state to every worker, new ones
included. With a fixed set of workers (no elastic driver) the same world is kept
and only the state is restored and re-synced.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ... import elastic as _elastic
from ...errors import AbortedError, CollectiveTimeoutError, PeerLostError
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .state import State

__all__ = ["run"]

log = logging.getLogger("unison.torch.elastic")
F = TypeVar("F", bound=Callable[..., Any])
_MAX_RESETS = 100
#: what a lost peer looks like from inside a step (Horovod: HorovodInternalError only;
#: unison's object collectives raise the core errors directly)
_RECOVERABLE = (HorovodInternalError, PeerLostError, AbortedError, CollectiveTimeoutError)
#: time.monotonic() of the last failure seen (recovery time = first commit after it)
last_failure_at: float | None = None


_JOIN_ATTEMPTS = 10


def _reset() -> None:
    """Leave the broken or outgrown world and join the next one. A world that breaks
    while it forms (a member died before the driver noticed) is left for the next."""
    from ... import world
    from .. import basics

    for attempt in range(1, _JOIN_ATTEMPTS + 1):
        basics.shutdown()
        if world.is_initialized():
            world.shutdown()
        try:
            basics.init()
            return
        except _RECOVERABLE as exc:
            if attempt == _JOIN_ATTEMPTS:
                raise
            log.warning("elastic: round %d failed to form (%s)", _elastic.current_round(), exc)


def run(func: F) -> F:
    """Decorate ``func(state, *args, **kwargs)`` so a recoverable failure restores
    ``state`` to its last commit and calls ``func`` again (in the new world when the job
    is elastic)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        global last_failure_at
        resets = 0
        skip_sync = False
        reset_required = False
        while True:
            if reset_required and _elastic.enabled():
                _reset()
                state.on_reset()
            try:
                if not skip_sync:  # inside: a member lost while syncing is a failure too
                    state.sync()
                return func(state, *args, **kwargs)
            except _RECOVERABLE as exc:
                resets += 1
                if resets > _MAX_RESETS and not _elastic.enabled():
                    raise
                last_failure_at = time.monotonic()
                log.warning("elastic: collective failed, restoring the last commit: %s", exc)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                log.warning("elastic: hosts updated, re-forming the world at this commit")
                skip_sync = exc.skip_sync and not _elastic.enabled()
            reset_required = True
            if not _elastic.enabled():
                state.on_reset()

    return wrapper  # type: ignore[return-value]
