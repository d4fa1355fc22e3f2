"""Engines that move the bytes: ``native`` (unison's own), ``mpi`` and ``torch``.

``unison.init(backend=...)`` or ``UNISON_BACKEND`` picks one. Validation, groups,
``Work`` and the error types are the same whichever runs; see :mod:`.base`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .base import Backend, BackendRuntime

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["BACKENDS", "Backend", "BackendRuntime", "open_runtime"]

#: every backend name ``init(backend=...)`` accepts
BACKENDS = ("native", "mpi", "torch")


def open_runtime(name: str, config: Config) -> BackendRuntime:
    """Join the job on an external engine (``mpi`` or ``torch``)."""
    if name == "mpi":
        from .mpi import open_runtime as open_mpi

        return open_mpi(config)
    if name == "torch":
        from .torch import open_runtime as open_torch

        return open_torch(config)
    raise InvalidArgumentError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
