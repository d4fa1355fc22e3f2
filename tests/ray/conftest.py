"""One local Ray cluster for the whole tests/ray session (starting one takes seconds):
two Ray nodes on this machine, 2 CPUs (and 2 declared GPUs) each, so placement across
nodes and the per-node numbering of ranks are exercised."""

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
        pytest.skip("Ray is not installed (pip install 'unison-collectives[ray]')")
    from ray.cluster_utils import Cluster

    # GPUs declared as a resource only (no device is touched): use_gpu's placement and
    # CUDA_VISIBLE_DEVICES handling are checked without a GPU
    node = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 * 1024 * 1024}
    cluster = None
    for attempt in (1, 2):  # Ray gives a raylet 30 s to register: a loaded machine misses it
        cluster = Cluster()
        try:
            cluster.add_node(**node, include_dashboard=False)  # the head
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            break
        except Exception:
            cluster.shutdown()
            if attempt == 2:
                raise
    assert cluster is not None
    try:
        ray.init(address=cluster.address, configure_logging=False)
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()
