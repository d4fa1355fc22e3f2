"""One local Ray instance for the whole tests/ray session (starting one takes seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

try:
    import ray
except ImportError:  # the test modules skip themselves with the reason
    ray = None


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    if ray is None:
        pytest.skip("Ray is not installed (pip install 'unison[ray]')")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
