"""Engines that move the bytes: ``native`` (unison's own), ``mpi`` and ``torch``.

:mod:`unison.world` picks one by name (``unison.init(backend=...)`` or
``UNISON_BACKEND``). Validation, groups, ``Work`` and the error types are the same
whichever runs; the seam is :class:`unison.comm.backend.Backend`.
"""

from __future__ import annotations

from .base import BackendRuntime

__all__ = ["BackendRuntime"]
