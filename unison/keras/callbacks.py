"""Horovod's Keras callbacks for Keras 3 (every backend)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from ..horovod.basics import rank, size
from ._engine import allreduce_numpy, broadcast_numpy

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "broadcast_global_variables",
    "variable_numpy",
]


def variable_numpy(v: Any) -> Any:
    """A variable's value: Keras 3's ``v.value`` (a tensor) or a ``tf.Variable``'s
    (Keras 2, where ``value`` is a method)."""
    value = v.value
    return keras.ops.convert_to_numpy(value() if callable(value) else value)


def broadcast_global_variables(model: Any, root_rank: int, exclude: Any = ()) -> None:
    """Give every rank ``root_rank``'s model (and optimizer) variables, but those in
    ``exclude`` (each rank keeps its own)."""
    skip = {id(v) for v in exclude}
    variables = [v for v in model.variables if id(v) not in skip]
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        opt_vars = opt.variables() if callable(opt.variables) else opt.variables
        variables += list(opt_vars)
    values = broadcast_numpy([variable_numpy(v) for v in variables], root_rank)
    for v, a in zip(variables, values, strict=True):
        v.assign(a)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Broadcast the model's and the optimizer's variables from ``root_rank`` at the end
    of the first batch (when the optimizer's variables exist), as Horovod does; the
    ``local_variables`` (and those given to ``register_local_var``) are left alone."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.broadcast_done = False
        self._local_vars: dict[int, Any] = {}
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """``var`` is this worker's own: it is not broadcast."""
        if not hasattr(var, "assign"):
            raise ValueError("All local variables must be of tf.Variable type.")
        self._local_vars[id(var)] = var

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        broadcast_global_variables(self.model, self.root_rank, self._local_vars.values())
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Average the epoch's metrics over ranks in place (put it before callbacks that read
    them)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def _average_metrics_in_place(self, logs: Any) -> None:
        if not logs:
            return
        names = sorted(logs)
        values = allreduce_numpy([np.asarray(float(logs[k]), np.float64) for k in names])
        for k, v in zip(names, values, strict=True):
            logs[k] = float(v)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._average_metrics_in_place(logs)


def _get_lr(opt: Any) -> float:
    return float(keras.ops.convert_to_numpy(opt.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between ``start_epoch``
    and ``end_epoch``: at each epoch's first batch (``staircase``) or every batch with a
    fractional epoch."""

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.restore_momentum: float | None = None
        self.current_epoch: int | None = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            m = float(multiplier)
            self.multiplier = lambda epoch: m**epoch

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return int(self.params["steps"])
        if self.params.get("samples") and self.params.get("batch_size"):
            return int(self.params["samples"] // self.params["batch_size"])
        raise ValueError(
            "Could not autodetect the number of steps per epoch. Please specify the "
            f"steps_per_epoch parameter to the {type(self).__name__}() or upgrade to the "
            "latest version of Keras."
        )

    def _adjust_learning_rate(self, epoch: float) -> None:
        opt = self.model.optimizer
        old_lr = _get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new_lr
        momentum = getattr(opt, "momentum", None)
        if self.momentum_correction and isinstance(momentum, (int, float)) and old_lr:
            self.restore_momentum = float(momentum)
            opt.momentum = self.restore_momentum * new_lr / old_lr

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        epoch = self.current_epoch if self.current_epoch is not None else 0
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(epoch)
        elif not self.staircase:
            assert self.steps_per_epoch
            self._adjust_learning_rate(epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size()`` to ``initial_lr`` over
    ``warmup_epochs`` (Goyal et al.), per batch."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            assert self.steps_per_epoch
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
            momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
        )  # fmt: skip
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.end_epoch is not None and epoch == self.end_epoch - 1 and self.verbose > 0:
            if rank() == 0:
                print(
                    f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                    f"{_get_lr(self.model.optimizer):g}."
                )
