"""Groups, ``Work``, the backend seam and the module-level API."""

from .api import *  # noqa: F403
from .api import __all__ as _api_all
from .work import Work

__all__ = [*_api_all, "Work"]
