"""``DistributedGradientTape`` and the gradient reduction shared with the optimizers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.negotiation import HvdOp
from .compression import Compression
from .mpi_ops import Adasum, Average, allreduce, grouped_allreduce

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "make_allreduce_grads_fn"]


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
        if not process_set.included() or process_set.size() == 1:
            return out  # Horovod's: nothing to reduce with on this rank
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
    def __init__(
        self,
        tape: tf.GradientTape,
        reduce: Callable[[list[Any]], list[Any]],
        process_set: ProcessSet,
        scale_local_gradients: bool,
    ) -> None:
        super().__init__(tape._persistent, tape._watch_accessed_variables)
        self._tape = tape._tape
        self._unison_reduce = reduce
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: dict[int, Any] = {}

    def register_local_source(self, source: Any) -> None:
        """``source``'s gradient stays this worker's own: it is not reduced (and, with
        ``scale_local_gradients``, it is divided by the set's size, as Horovod does)."""
        self._local_sources[id(source)] = source  # held: its id stays its own

    def _is_local(self, source: Any) -> bool:
        return id(source) in self._local_sources

    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_s = tf.nest.flatten(sources, expand_composites=False)
        flat_g = list(tf.nest.flatten(grads, expand_composites=False))
        shared = [i for i, src in enumerate(flat_s) if not self._is_local(src)]
        reduced = self._unison_reduce([flat_g[i] for i in shared])
        for i, g in zip(shared, reduced, strict=True):
            flat_g[i] = g
        if self.scale_local_gradients and len(shared) < len(flat_s):
            n = float(self.process_set.size())
            for i, src in enumerate(flat_s):
                g = flat_g[i]
                if g is None or not self._is_local(src):
                    continue
                if isinstance(g, tf.IndexedSlices):
                    flat_g[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                else:
                    flat_g[i] = g / n
        return tf.nest.pack_sequence_as(grads, flat_g)

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None
    ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """``gradient()`` split into (local source, gradient) and (shared source, gradient)
        pairs, in the order of ``sources``."""
        grads = self.gradient(target, sources, output_gradients)
        local: list[tuple[Any, Any]] = []
        shared: list[tuple[Any, Any]] = []
        for src, g in zip(sources, grads, strict=True):
            (local if self._is_local(src) else shared).append((src, g))
        return local, shared


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
    """A tape whose ``gradient()`` averages (``op``) the gradients over the process set;
    sources registered with ``register_local_source`` keep their own gradient."""
    reduce = make_allreduce_grads_fn(
        compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
        process_set,
    )  # fmt: skip
    return _DistributedGradientTape(gradtape, reduce, process_set, scale_local_gradients)


def PartialDistributedGradientTape(
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
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A :func:`DistributedGradientTape` that leaves the gradients of ``local_layers``'
    trainable weights unreduced (each worker keeps its own)."""
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, (list, tuple)):
        layers = list(local_layers)
    else:
        layers = [local_layers]
    if not all(hasattr(layer, "trainable_weights") for layer in layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
        gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients,
    )  # fmt: skip
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
