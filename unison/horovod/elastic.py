"""Elastic training for every front end: ``run``, ``State`` and ``ObjectState``.

``@hvd.elastic.run`` retries a training function from the last committed state.
Horovod's loop: ``state.sync()``, call ``func(state)``; on
:class:`HorovodInternalError` restore the last commit, on
:class:`HostsUpdatedInterrupt` keep the state; then reset and go again. In an
elastic job (``unison run --min-np/--max-np/--host-discovery-script``) the reset
re-forms the world: ``hvd.shutdown()``, then ``hvd.init()`` joins the driver's next
round (new ranks and size, same store), ``state.on_reset()`` runs the reset
callbacks and ``state.sync()`` copies rank 0's state to every worker, new ones
included. With a fixed set of workers (no elastic driver) the same world is kept
and only the state is restored and re-synced. Front ends add their own states
(``TorchState``, ``TensorFlowKerasState``...) on top of :class:`ObjectState`.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .. import elastic as _elastic
from ..errors import AbortedError, CollectiveTimeoutError, PeerLostError
from .basics import rank
from .errors import HorovodInternalError, HostsUpdatedInterrupt
from .functions import broadcast_object

__all__ = ["ObjectState", "State", "run"]


log = logging.getLogger("unison.horovod.elastic")
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
    from .. import world
    from . import basics

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


class State:
    """Base: ``commit()`` saves, ``restore()`` rolls back, ``sync()`` copies rank 0's."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank at once when the elastic
        driver has published a newer world (rank 0 looks, everyone gets its answer);
        with a fixed set of workers there is never an update."""
        if not _elastic.enabled():
            return
        seen = _elastic.hosts_updated() if rank() == 0 else False
        if broadcast_object(seen, 0, name="elastic.hosts_updated"):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain picklable attributes (``state.epoch``, ``state.batch``...)."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self._bcast = bcast_object or (lambda obj: broadcast_object(obj, 0, name="elastic.state"))
        self._saved = dict(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def _values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._saved}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for k, v in copy.deepcopy(self._saved).items():
            setattr(self, k, v)

    def sync(self) -> None:
        if self._saved:
            values = self._bcast(self._values())
            for k, v in values.items():
                setattr(self, k, v)
            self.save()
