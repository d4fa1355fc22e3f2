"""Run unison jobs on a Ray cluster: ``horovod.ray``'s ``RayExecutor``, on unison.

    from unison.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    executor.start()
    print(executor.run(train))          # [rank 0's result, rank 1's result]
    executor.shutdown()

Needs Ray (``pip install 'unison-collectives[ray]'``); ``import unison`` never imports it.
See docs/ray.md.
"""

from __future__ import annotations

from .._version import install_hint

try:
    import ray as _ray  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"unison.ray needs Ray, which is not installed: {install_hint('ray')}"
    ) from _exc

from .discovery import RayHostDiscovery
from .elastic import ElasticRayExecutor
from .errors import RayStartTimeoutError, RayWorkerLostError
from .runner import FAILURE_GRACE, MiniSettings, RayExecutor
from .worker import UnisonRayWorker

__all__ = [
    "ElasticRayExecutor",
    "FAILURE_GRACE",
    "MiniSettings",
    "RayExecutor",
    "RayHostDiscovery",
    "RayStartTimeoutError",
    "RayWorkerLostError",
    "UnisonRayWorker",
]
