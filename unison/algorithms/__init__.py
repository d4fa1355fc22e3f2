"""Collective algorithms: one per module, each with ``cost()``, ``supports()`` and ``run``.

Schedules (who talks to whom) are pure functions in :mod:`._schedule`; the data
movement uses an :class:`OpContext`; :mod:`.select` picks one per call by cost.
"""

from ..link import Link
from ._context import OpContext, describe
from .select import REGISTRY, Choice, choose
from .topology import Topology

__all__ = ["REGISTRY", "Choice", "Link", "OpContext", "Topology", "choose", "describe"]
