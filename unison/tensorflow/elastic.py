"""Elastic training with a fixed set of workers: ``run``, ``TensorFlowKerasState`` and
``TensorFlowState`` (variables), committed and restored on every rank."""

from __future__ import annotations

from typing import Any

from ..horovod.elastic import ObjectState, State, run

__all__ = ["ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "run"]


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` and plain attributes."""

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any) -> None:
        self.variables = list(variables or [])
        self._var_saved: list[Any] = []
        super().__init__(**kwargs)
        self._save_vars()

    def _save_vars(self) -> None:
        self._var_saved = [v.numpy().copy() for v in self.variables]

    def save(self) -> None:
        self._save_vars()
        super().save()

    def restore(self) -> None:
        for v, a in zip(self.variables, self._var_saved, strict=True):
            v.assign(a)
        super().restore()

    def sync(self) -> None:
        from .functions import broadcast_variables

        if self.variables:
            broadcast_variables(self.variables, 0)
        super().sync()
        self._save_vars()


def TensorFlowKerasState(model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
    """Horovod's ``TensorFlowKerasState``: see :class:`unison.keras.elastic.KerasState`."""
    from ..keras.elastic import KerasState

    return KerasState(model, optimizer, backend, **kwargs)
