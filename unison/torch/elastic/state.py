"""Elastic state objects: what ``commit`` saves and ``restore`` brings back (``State``
and ``ObjectState`` are the engine's, :mod:`unison.horovod.elastic`)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from ...horovod.elastic import ObjectState, State
from ..functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["ObjectState", "State", "TorchState"]


class TorchState(ObjectState):
    """A model, an optimizer and any other attributes (samplers keep their progress)."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if hasattr(v, "load_state_dict")}
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        for k, v in self._samplers.items():
            object.__setattr__(self, k, v)
        self._model_saved: dict[str, Any] | None = None
        self._opt_saved: dict[str, Any] | None = None
        self._sampler_saved: dict[str, Any] = {}
        super().__init__(**plain)
        self.save()

    def save(self) -> None:
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._opt_saved = copy.deepcopy(self.optimizer.state_dict())
        self._sampler_saved = {k: copy.deepcopy(s.state_dict()) for k, s in self._samplers.items()}
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(self._opt_saved)
        for k, s in self._samplers.items():
            s.load_state_dict(self._sampler_saved[k])
        super().restore()

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for k, s in self._samplers.items():
            # every rank processed different samples: the union is what is done
            sd = broadcast_object(s.state_dict(), 0, name=f"elastic.sampler.{k}")
            done = allgather_object(
                s.state_dict().get("processed_indices", []), name=f"elastic.sampler.{k}.done"
            )
            sd["processed_indices"] = sorted({i for part in done for i in part})
            s.load_job_state_dict(sd)
        super().sync()
