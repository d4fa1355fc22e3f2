"""``elastic.run`` for unison.torch: the engine's (:mod:`unison.horovod.elastic`)."""

from __future__ import annotations

from ...horovod.elastic import run

__all__ = ["run"]
