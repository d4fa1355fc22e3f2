"""``DistributedOptimizer`` of ``horovod.tensorflow``: Keras 3 optimizers (tf.keras in
TensorFlow 2.16+) are wrapped by :func:`unison.keras.DistributedOptimizer`."""

from __future__ import annotations

from typing import Any

from ..horovod.basics import ProcessSet, global_process_set
from .compression import Compression
from .mpi_ops import Average

__all__ = ["DistributedOptimizer"]


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
    """Wrap a Keras optimizer so it averages gradients over the process set."""
    from ..keras.optimizer import DistributedOptimizer as keras_distributed

    return keras_distributed(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
    )  # fmt: skip
