"""Ray's node membership as a host list: ``horovod.ray``'s ``RayHostDiscovery``.

:meth:`RayHostDiscovery.find_available_hosts_and_slots` maps each alive Ray node (by its
address) to the workers it can hold. ``python -m unison.ray.discovery --address auto``
prints the same as Horovod's host-discovery-script format (one ``host:slots`` per line),
so an elastic ``unison run --host-discovery-script`` can follow a Ray cluster's nodes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence

import ray

__all__ = ["RayHostDiscovery", "format_hosts", "main"]


class RayHostDiscovery:
    """Slots per alive node: CPUs // ``cpus_per_worker`` (and GPUs // ``gpus_per_worker``,
    whichever is fewer, with ``use_gpu``)."""

    def __init__(
        self, use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: float = 1
    ) -> None:
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{node address: slots}`` over the alive nodes of the connected cluster."""
        hosts: dict[str, int] = {}
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive", node.get("alive")):
                continue
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus_per_worker)
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_worker))
            host = str(node["NodeManagerAddress"])
            hosts[host] = hosts.get(host, 0) + slots
        return hosts


def format_hosts(hosts: Mapping[str, int]) -> str:
    """Horovod's discovery-script output: ``host:slots`` lines, hosts with no slot left out."""
    return "".join(f"{h}:{n}\n" for h, n in hosts.items() if n > 0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="print a Ray cluster's nodes as host:slots lines")
    ap.add_argument("--address", default="auto", help="the Ray cluster (default: auto)")
    ap.add_argument("--cpus-per-worker", type=float, default=1)
    ap.add_argument("--gpus-per-worker", type=float, default=1)
    ap.add_argument("--use-gpu", action="store_true")
    args = ap.parse_args(argv)
    if not ray.is_initialized():
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    found = RayHostDiscovery(args.use_gpu, args.cpus_per_worker, args.gpus_per_worker)
    sys.stdout.write(format_hosts(found.find_available_hosts_and_slots()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
