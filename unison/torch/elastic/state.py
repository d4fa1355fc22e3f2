"""Elastic state objects: what ``commit`` saves and ``restore`` brings back."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ... import elastic as _elastic
from ..basics import rank
from ..errors import HostsUpdatedInterrupt
from ..functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["ObjectState", "State", "TorchState"]


class State:
    """Base: ``commit()`` saves, ``restore()`` rolls back, ``sync()`` copies rank 0's."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank at once when the elastic
        driver has published a newer world (rank 0 looks, everyone gets its answer);
        with a fixed set of workers there is never an update."""
        if not _elastic.enabled():
            return
        seen = _elastic.hosts_updated() if rank() == 0 else False
        if broadcast_object(seen, 0, name="elastic.hosts_updated"):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain picklable attributes (``state.epoch``, ``state.batch``...)."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self._bcast = bcast_object or (lambda obj: broadcast_object(obj, 0, name="elastic.state"))
        self._saved = dict(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def _values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._saved}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for k, v in copy.deepcopy(self._saved).items():
            setattr(self, k, v)

    def sync(self) -> None:
        if self._saved:
            values = self._bcast(self._values())
            for k, v in values.items():
                setattr(self, k, v)
            self.save()


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
