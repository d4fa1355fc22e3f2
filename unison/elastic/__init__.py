"""Elastic jobs, independent of who starts the workers.

A *driver* (``unison run``'s elastic mode, or a Ray executor) owns the membership:
which workers are alive, on which hosts (:mod:`.discovery`: a discovery script, a
fixed host list, a blacklist with cool-down), and what rank each gets
(:func:`.membership.plan`, :func:`.membership.assign`). It publishes each new world
as a numbered *round* in the job's authenticated store (:mod:`.rendezvous`). A
*worker* (:mod:`.worker`) joins the newest round that names it; ``unison.init()``
does this by itself when ``UNISON_ELASTIC_ID`` is set, so after a reset
(``shutdown()`` then ``init()``) a process is in the new world with its new rank and
size. Each round is its own peer rendezvous in the same store.
"""

from __future__ import annotations

from .discovery import (
    Blacklist,
    FixedHosts,
    HostDiscovery,
    ScriptDiscovery,
    blacklisted,
    parse_hosts_output,
)
from .membership import Member, assign, plan
from .rendezvous import Assignment, Round, cancel, latest_round, publish, read_round
from .worker import ElasticWorker, current_round, enabled, hosts_updated, join, worker

__all__ = [
    "Assignment",
    "Blacklist",
    "ElasticWorker",
    "FixedHosts",
    "HostDiscovery",
    "Member",
    "Round",
    "ScriptDiscovery",
    "assign",
    "blacklisted",
    "cancel",
    "current_round",
    "enabled",
    "hosts_updated",
    "join",
    "latest_round",
    "parse_hosts_output",
    "plan",
    "publish",
    "read_round",
    "worker",
]
