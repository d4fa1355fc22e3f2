"""Placing the workers: one actor per rank in a placement group, ranks packed per node.

Two layouts, as in ``horovod.ray``: ``num_workers`` actors in a ``PACK`` placement group
of one bundle per worker (or in the placement group the caller already runs in), or
``num_hosts`` hosts of ``num_workers_per_host`` actors each (a ``STRICT_SPREAD`` group of
one bundle per host). Ranks are then numbered node by node (nodes in the order their
first actor appeared), so the ranks of a node are consecutive and ``local_rank`` /
``local_size`` / ``cross_rank`` / ``cross_size`` mean what they mean under ``unison run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..launch.hosts import Slot
from .errors import RayStartTimeoutError
from .worker import UnisonRayWorker

__all__ = ["Layout", "Placement", "order_by_node"]


@dataclass(frozen=True)
class Layout:
    """How many actors, with which resources, in which placement group shape."""

    num_workers: int | None
    num_hosts: int | None
    num_workers_per_host: int
    cpus_per_worker: float
    gpus_per_worker: float
    use_current_placement_group: bool = True

    @property
    def size(self) -> int:
        if self.num_workers:
            return int(self.num_workers)
        return int(self.num_hosts or 0) * self.num_workers_per_host


@dataclass
class Placement:
    """The placement group (when this executor created it) and the actors, in rank order."""

    group: PlacementGroup | None
    owned: bool
    actors: list[Any]
    slots: list[Slot]
    ips: list[str]
    pids: list[int]

    @classmethod
    def create(cls, layout: Layout, pg_timeout: float, start_timeout: float) -> Placement:
        per_worker: dict[str, float] = {"CPU": float(layout.cpus_per_worker)}
        if layout.gpus_per_worker:
            per_worker["GPU"] = float(layout.gpus_per_worker)
        current = get_current_placement_group() if layout.use_current_placement_group else None
        if current is not None and layout.num_workers:
            group, owned, bundles = current, False, [-1] * layout.size
        elif layout.num_workers:
            group = _ready(placement_group([dict(per_worker)] * layout.size, "PACK"), pg_timeout)
            owned, bundles = True, list(range(layout.size))
        else:
            per_host = {k: v * layout.num_workers_per_host for k, v in per_worker.items()}
            hosts = int(layout.num_hosts or 0)
            group = _ready(placement_group([per_host] * hosts, "STRICT_SPREAD"), pg_timeout)
            owned = True
            bundles = [h for h in range(hosts) for _ in range(layout.num_workers_per_host)]
        remote_cls: Any = ray.remote(UnisonRayWorker)
        actors: list[Any] = [
            remote_cls.options(
                num_cpus=layout.cpus_per_worker,
                num_gpus=layout.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=b, placement_group_capture_child_tasks=False
                ),
            ).remote()
            for b in bundles
        ]
        try:
            infos = ray.get([a.node_info.remote() for a in actors], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            _kill(actors)
            if owned:
                remove_placement_group(group)
            raise RayStartTimeoutError(
                f"unison.ray: the {len(actors)} worker actors did not start within "
                f"{start_timeout:g} s (settings.timeout_s)"
            ) from None
        order, slots = order_by_node([i[0] for i in infos])
        return cls(
            group,
            owned,
            [actors[i] for i in order],
            [replace(s, host=infos[i][1]) for s, i in zip(slots, order, strict=True)],
            [infos[i][2] for i in order],
            [infos[i][3] for i in order],
        )

    def release(self) -> None:
        """Kill the actors and remove the placement group this executor created."""
        _kill(self.actors)
        self.actors = []
        if self.owned and self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:  # the cluster may already be gone
                pass
        self.group = None


def order_by_node(node_ids: Sequence[str]) -> tuple[list[int], list[Slot]]:
    """Number the actors node by node: (actor index of each rank, each rank's slot)."""
    nodes: dict[str, list[int]] = {}
    for index, node in enumerate(node_ids):
        nodes.setdefault(node, []).append(index)
    order: list[int] = []
    slots: list[Slot] = []
    for cross_rank, (node, members) in enumerate(nodes.items()):
        for local_rank, index in enumerate(members):
            slots.append(Slot(len(order), node, local_rank, len(members), cross_rank, len(nodes)))
            order.append(index)
    return order, slots


def _ready(group: PlacementGroup, timeout: float) -> PlacementGroup:
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if ready:
        return group
    requested = group.bundle_specs
    remove_placement_group(group)
    # horovod.ray's text, so logs and searches match
    raise RayStartTimeoutError(
        "Placement group creation timed out. Make sure your cluster either has enough "
        "resources or use an autoscaling cluster. Current resources available: "
        f"{ray.available_resources()}"  # type: ignore[no-untyped-call]
        f", resources requested by the placement group: {requested}"
    )


def _kill(actors: Sequence[Any]) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or the cluster is gone
            pass
