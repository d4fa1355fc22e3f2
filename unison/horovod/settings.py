"""The training layer's knobs: ``UNISON_*`` (unison.config) with Horovod's names as aliases.

A ``UNISON_*`` variable wins; otherwise the ``HOROVOD_*`` variable of the same
meaning is read, so scripts and job files written for Horovod keep their tuning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import Config, load_config
from ..errors import InvalidArgumentError

__all__ = ["Settings", "load_settings"]

_ALIASES: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    # field: (UNISON name, HOROVOD name, parser of the Horovod value)
    "fusion_threshold": ("UNISON_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", int),
    "cycle_time": ("UNISON_CYCLE_TIME", "HOROVOD_CYCLE_TIME", float),
    "cache_capacity": ("UNISON_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", int),
    "timeline": ("UNISON_TIMELINE", "HOROVOD_TIMELINE", str),
    "timeline_mark_cycles": (
        "UNISON_TIMELINE_MARK_CYCLES",
        "HOROVOD_TIMELINE_MARK_CYCLES",
        lambda s: s.strip().lower() in ("1", "true", "yes", "on"),
    ),
    "stall_check_disable": (
        "UNISON_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_DISABLE",
        lambda s: s.strip().lower() in ("1", "true", "yes", "on"),
    ),
    "stall_check_time": (
        "UNISON_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_CHECK_TIME_SECONDS",
        float,
    ),
    "stall_shutdown_time": (
        "UNISON_STALL_SHUTDOWN_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        float,
    ),
}


@dataclass(frozen=True)
class Settings:
    timeout: float
    fusion_threshold: int
    cycle_time: float  # seconds
    cache_capacity: int
    timeline: str
    timeline_mark_cycles: bool
    stall_check_disable: bool
    stall_check_time: float
    stall_shutdown_time: float
    gradient_overlap: str  # on, off, auto (unison.torch's DistributedOptimizer)


def load_settings(cfg: Config | None = None, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    cfg = load_config(env) if cfg is None else cfg
    values: dict[str, Any] = {}
    for fld, (uname, hname, parse) in _ALIASES.items():
        value = getattr(cfg, fld)
        if not env.get(uname) and env.get(hname):
            try:
                value = parse(env[hname])
            except ValueError:
                raise InvalidArgumentError(f"{hname}={env[hname]!r} is not valid") from None
        values[fld] = value
    values["cycle_time"] = max(0.0, float(values["cycle_time"])) / 1000.0
    if values["stall_check_time"] <= 0:
        raise InvalidArgumentError("the stall check time must be > 0 seconds")
    return Settings(timeout=cfg.timeout, gradient_overlap=cfg.gradient_overlap, **values)
