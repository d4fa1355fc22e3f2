"""Horovod's error names for ``unison.torch``: the engine's (:mod:`unison.horovod.errors`)."""

from __future__ import annotations

from ..horovod.errors import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "TensorMismatchError"]
