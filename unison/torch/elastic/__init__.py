"""Elastic training with a fixed set of workers: commit, restore, retry.

``@hvd.elastic.run`` wraps a training function taking a state object. When a
collective fails with :class:`HorovodInternalError`, the state is restored to
its last ``commit()`` on every rank, re-synchronized from rank 0 and the
function runs again. (Adding or removing hosts is not supported: unison run
starts a fixed set of workers.)
"""

from __future__ import annotations

from .run import run
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]
