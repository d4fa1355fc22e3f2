"""Values logged by the workers, delivered to the driver's callbacks (Horovod's
``horovod.ray.ray_logger``).

Inside a function run by a :class:`~unison.ray.RayExecutor` (or the elastic form),
``ray_logger.log({"loss": 0.1, "epoch": 2})`` sends the dict to the driver, where
every callback passed to ``run(..., callbacks=[...])`` / ``execute(..., callbacks=[...])``
is called with it, in the order the worker logged them. By default only rank 0's
values are sent (``chief_only=True``); the rank is the worker's current one, so after an
elastic reset the new rank 0 logs. Without callbacks nothing is configured and
``log`` warns once, as Horovod's does.

The driver side (:class:`CallbackPump`) owns a ``ray.util.queue.Queue`` (an actor
asking for no CPU) and a thread that hands its items to the callbacks.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from ..log import get_logger

__all__ = ["CallbackPump", "configure", "log"]

_log = get_logger("ray")
_queue: Any = None
_queue_set = False
warning_raised = False
PUMP_INTERVAL = 0.1  # seconds between looks at the queue on the driver


def configure(queue: Any) -> None:
    """Send later :func:`log` calls of this process to ``queue`` (set by the executor)."""
    global _queue, _queue_set
    _queue = queue
    _queue_set = True


def log(info_dict: dict[str, Any], chief_only: bool = True) -> None:
    """Send ``info_dict`` to the driver's callbacks (only from rank 0 unless
    ``chief_only=False``)."""
    global warning_raised
    rank = os.environ.get("HOROVOD_RANK", os.environ.get("UNISON_RANK"))
    if chief_only and rank != "0":
        return
    if _queue_set:
        _queue.put(info_dict)
    elif not warning_raised:
        warnings.warn("`ray_logger.log` called but logging is not configured.", stacklevel=2)
        warning_raised = True


class CallbackPump:
    """The driver side of one ``run``/``execute`` with callbacks: a queue the workers
    put into, a thread that calls every callback on every item. The first exception a
    callback raises is re-raised when the pump is closed (after the run)."""

    def __init__(self, callbacks: Iterable[Callable[[Any], Any]] | None) -> None:
        self.callbacks = list(callbacks or ())
        self.queue: Any = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CallbackPump:
        if self.callbacks:
            import ray
            from ray.util.queue import Queue

            node = ray.get_runtime_context().get_node_id()
            # no CPU, on the driver's node: it must not take a worker's slot
            self.queue = Queue(
                actor_options={
                    "num_cpus": 0,
                    "scheduling_strategy": _on_node(node),
                }
            )
            self._thread = threading.Thread(target=self._pump, name="unison-ray-callbacks")
            self._thread.daemon = True
            self._thread.start()
        return self

    def attach(self, actor: Any) -> Any:
        """Point ``actor``'s :func:`log` at the queue (a Ray call ordered before the
        actor's later calls); None without callbacks."""
        if self.queue is None:
            return None
        return actor.set_queue.remote(self.queue)

    def _deliver(self) -> bool:
        """Hand every queued item to the callbacks; whether there were any."""
        n = self.queue.qsize()
        if not n:
            return False
        for item in self.queue.get_nowait_batch(n):
            for cb in self.callbacks:
                try:
                    cb(item)
                except BaseException as exc:  # kept for the caller; the pump goes on
                    if self.error is None:
                        self.error = exc
                    _log.error("unison.ray: a callback raised: %r", exc)
        return True

    def _pump(self) -> None:
        while not self._stop.wait(PUMP_INTERVAL):
            try:
                self._deliver()
            except Exception as exc:  # the queue actor died: nothing more to deliver
                _log.error("unison.ray: the callback queue failed: %r", exc)
                return

    def __exit__(
        self,
        tp: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.queue is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        try:
            while self._deliver():  # what was logged after the last look
                pass
        except Exception:
            pass
        finally:
            self.queue.shutdown()
        if exc is None and self.error is not None:
            raise self.error


def _on_node(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=True)
