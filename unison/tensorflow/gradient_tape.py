"""``DistributedGradientTape`` and the gradient reduction shared with the optimizers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.negotiation import HvdOp
from .compression import Compression
from .mpi_ops import Adasum, Average, allreduce, grouped_allreduce

__all__ = ["DistributedGradientTape", "make_allreduce_grads_fn"]


def make_allreduce_grads_fn(
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[list[Any]], list[Any]]:
    """A function that reduces a list of gradients (``None`` entries stay ``None``)."""
    rop = HvdOp(int(op))
    if gradient_predivide_factor != 1.0:
        if rop != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        pre, post = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        pre = post = 1.0
    if rop == Adasum and process_set is not global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")

    def reduce(grads: list[Any]) -> list[Any]:
        out: list[Any] = list(grads)
        dense: list[int] = []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                if sparse_as_dense:
                    out[i] = tf.convert_to_tensor(g)
                    dense.append(i)
                else:
                    out[i] = allreduce(g, op=rop, process_set=process_set)
            else:
                dense.append(i)
        if not dense:
            return out
        if num_groups > 0:
            k = max(1, -(-len(dense) // num_groups))
            chunks = [dense[j : j + k] for j in range(0, len(dense), k)]
        else:
            chunks = [dense]
        for chunk in chunks:
            ys = grouped_allreduce(
                [out[i] for i in chunk], compression=compression, op=rop,
                prescale_factor=pre, postscale_factor=post, process_set=process_set,
            )  # fmt: skip
            for i, y in zip(chunk, ys, strict=True):
                out[i] = y
        return out

    return reduce


class _DistributedGradientTape(tf.GradientTape):  # type: ignore[misc]
    def __init__(self, tape: tf.GradientTape, reduce: Callable[[list[Any]], list[Any]]) -> None:
        super().__init__(tape._persistent, tape._watch_accessed_variables)
        self._tape = tape._tape
        self._unison_reduce = reduce

    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, self._unison_reduce(list(flat)))


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A tape whose ``gradient()`` averages (``op``) the gradients over the process set."""
    reduce = make_allreduce_grads_fn(
        compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
        process_set,
    )  # fmt: skip
    return _DistributedGradientTape(gradtape, reduce)
