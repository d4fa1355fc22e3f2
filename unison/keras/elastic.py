"""Elastic training for Keras 3 with a fixed set of workers: ``KerasState`` (Horovod's
``TensorFlowKerasState``) and the callbacks that commit it and keep its counters."""

from __future__ import annotations

from typing import Any

import keras

from ..horovod.elastic import ObjectState, State, run
from .callbacks import broadcast_global_variables, variable_numpy

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "State",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


def _variables(model: Any, optimizer: Any) -> list[Any]:
    vs = list(model.variables) if model is not None else []
    if optimizer is not None:
        # Keras 3 and tf_keras' optimizers: a property; tf_keras' legacy ones: a method
        opt_vars = optimizer.variables
        vs += list(opt_vars() if callable(opt_vars) else opt_vars)
    return vs


class KerasState(ObjectState):
    """A Keras model, its optimizer and plain attributes (``epoch``, ``batch``...):
    ``commit()`` keeps a copy of every variable, ``restore()`` puts it back, ``sync()``
    gives every rank rank 0's."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._values_saved: list[Any] = []
        super().__init__(**kwargs)
        self._save_variables()

    def _save_variables(self) -> None:
        self._values_saved = [
            variable_numpy(v).copy() for v in _variables(self.model, self.optimizer)
        ]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        vs = _variables(self.model, self.optimizer)
        if len(vs) == len(self._values_saved):
            for v, a in zip(vs, self._values_saved, strict=True):
                v.assign(a)
        super().restore()

    def sync(self) -> None:
        if self.model is not None:
            broadcast_global_variables(self.model, 0)
        super().sync()
        self._save_variables()


TensorFlowKerasState = KerasState


class CommitStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch's end."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Keep ``state.batch`` at the next batch to run (reset to 0 at each epoch's end)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = int(self.params["steps"])
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Keep ``state.epoch`` at the next epoch to run."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = epoch + 1
