"""unison.tensorflow: Horovod's TensorFlow 2 API on unison.

A script written for ``horovod.tensorflow`` runs unchanged with::

    import unison.tensorflow as hvd

and ``unison run -np N python train.py``. Every collective goes to the same
background engine as :mod:`unison.torch` (negotiation by rank 0, tensor fusion,
response cache, timeline, stall inspector, mismatch errors on every rank):
:mod:`unison.tensorflow._bridge` turns ``tf.Tensor`` into the engine's CPU
buffers and back, eagerly or through ``tf.py_function`` inside ``tf.function``.
"""

from __future__ import annotations

from .._version import require_framework

require_framework("tensorflow", "unison.tensorflow", "tensorflow")  # if missing: an install hint

from typing import Any

from ..horovod.basics import (
    ProcessSet,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ..horovod.errors import HorovodInternalError, HostsUpdatedInterrupt
from ..horovod.ops import barrier, join
from . import elastic, util
from .compression import Compression
from .functions import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from .optimizer import DistributedOptimizer
from .runner import ensure_inter_op_threads
from .size_ops import (
    cross_rank_op,
    cross_size_op,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .util import executing_eagerly as _executing_eagerly  # noqa: F401 - Horovod scripts use it
from .util import refs_to_vars, vars_to_refs

ensure_inter_op_threads()


def __getattr__(name: str) -> Any:
    # the Keras layer imports Keras: only when a script asks for it
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "size_op",
    "rank_op",
    "process_set_included_op",
    "local_size_op",
    "local_rank_op",
    "cross_size_op",
    "cross_rank_op",
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "PartialDistributedGradientTape",
    "SyncBatchNormalization",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "refs_to_vars",
    "util",
    "vars_to_refs",
]
