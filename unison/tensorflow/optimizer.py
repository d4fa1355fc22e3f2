"""``DistributedOptimizer`` of ``horovod.tensorflow``: Keras optimizers (Keras 3, or
Keras 2 with ``TF_USE_LEGACY_KERAS=1``) are wrapped by
:func:`unison.keras.DistributedOptimizer`; a ``tf.compat.v1.train.Optimizer`` by a
wrapper whose ``compute_gradients`` reduces the gradients over the process set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..horovod.basics import ProcessSet, global_process_set
from .compression import Compression
from .gradient_tape import make_allreduce_grads_fn
from .mpi_ops import Average

__all__ = ["DistributedOptimizer"]


class _DistributedLegacyOptimizer(tf.compat.v1.train.Optimizer):  # type: ignore[misc]
    """A ``tf.compat.v1.train.Optimizer`` whose gradients are reduced over the process set
    in ``compute_gradients``; everything else is the wrapped optimizer's."""

    def __init__(
        self,
        optimizer: Any,
        name: str | None,
        use_locking: bool,
        reduce: Callable[[list[Any]], list[Any]],
    ) -> None:
        super().__init__(
            name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking
        )
        self._optimizer = optimizer
        self._unison_reduce = reduce

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        grads = self._unison_reduce([g for g, _ in pairs])
        return list(zip(grads, [v for _, v in pairs], strict=True))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Wrap an optimizer so it averages (``op``) gradients over the process set."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise NotImplementedError(
                "backward_passes_per_step > 1 is not supported with a "
                "tf.compat.v1.train.Optimizer; aggregate with a Keras optimizer"
            )
        reduce = make_allreduce_grads_fn(
            compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
            process_set,
        )  # fmt: skip
        return _DistributedLegacyOptimizer(optimizer, name, use_locking, reduce)
    from ..keras.optimizer import DistributedOptimizer as keras_distributed

    return keras_distributed(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
    )  # fmt: skip
