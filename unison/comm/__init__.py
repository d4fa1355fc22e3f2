"""Communicators, groups, ``Work`` and the module-level API."""

from .api import *  # noqa: F403
from .api import __all__ as _api_all
from .runtime import current, init, is_initialized, shutdown
from .work import Work

__all__ = [*_api_all, "Work", "current", "init", "is_initialized", "shutdown"]
