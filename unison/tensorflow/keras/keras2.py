"""Horovod's ``horovod.tensorflow.keras`` on Keras 2 (``tf_keras``, what ``tf.keras``
is under ``TF_USE_LEGACY_KERAS=1``): the optimizer wrapper and the callbacks for its
optimizers (``tf.keras.optimizers.*`` and ``tf.keras.optimizers.legacy.*``) and its
``Model.fit``. The collectives, the topology and the rest are :mod:`unison.keras`'s."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ...horovod.aggregation import check_passes
from ...horovod.basics import ProcessSet, global_process_set
from ...horovod.negotiation import HvdOp
from ...keras import callbacks as _k3_callbacks
from ..compression import Compression
from ..gradient_aggregation import LocalGradientAggregation
from ..gradient_tape import make_allreduce_grads_fn

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "DistributedOptimizer",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "PartialDistributedOptimizer",
    "load_model",
]

_keras = tf.keras


class _Variables:
    """Variables the wrapper refers to, held outside the tracking of the optimizer's
    attributes (which would checkpoint them as the optimizer's own)."""

    def __init__(self) -> None:
        self.local: dict[int, Any] = {}


class _Distributed:
    """Mixed in before a Keras 2 optimizer's class: the gradients are reduced over the
    process set where they are computed, as Horovod's wrapper does (``compute_gradients``
    of the optimizers of Keras 2.11+, which ``minimize`` and so ``Model.fit`` call;
    ``_compute_gradients`` and ``get_gradients`` of the legacy ones). Gradients computed
    elsewhere (a plain ``tf.GradientTape``) are applied as given, as in Horovod: reduce
    those with ``DistributedGradientTape``.

    With ``backward_passes_per_step`` N > 1 (Horovod's ``_agg_helper``, a
    :class:`~unison.tensorflow.gradient_aggregation.LocalGradientAggregation`) the
    gradients are summed locally and reduced on every Nth pass only, and
    ``apply_gradients`` updates the variables only then; on the other passes it only
    advances ``iterations``, which so counts passes, as in Horovod."""

    _unison: dict[str, Any]
    _agg_helper: LocalGradientAggregation | None

    def unison_configure(
        self,
        reduce: Any,
        process_set: ProcessSet,
        scale_local_gradients: bool,
        aggregation: LocalGradientAggregation | None = None,
    ) -> None:
        """How this optimizer reduces: ``reduce`` (a list of gradients), over which set,
        summed locally over passes by ``aggregation`` first where one is given."""
        self._unison = dict(
            reduce=reduce, process_set=process_set,
            scale_local_gradients=scale_local_gradients, vars=_Variables(),
        )  # fmt: skip
        self._agg_helper = aggregation

    def register_local_var(self, var: Any) -> None:
        """``var``'s gradient stays this worker's own: it is not reduced (and, with
        ``scale_local_gradients``, it is divided by the set's size, as Horovod does)."""
        self._unison["vars"].local[id(var)] = var

    def _unison_reduce(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        grads = [g for g, _ in pairs]
        agg = self._agg_helper
        if agg is None:
            grads = self._unison_reduce_now(grads, variables)
        else:
            grads = agg.accumulate(grads, lambda gs: self._unison_reduce_now(gs, variables))
        return list(zip(grads, variables, strict=True))

    def _unison_reduce_now(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        u = self._unison
        local = u["vars"].local
        shared = [i for i, v in enumerate(variables) if id(v) not in local]
        reduced = u["reduce"]([grads[i] for i in shared])
        out = list(grads)
        for i, g in zip(shared, reduced, strict=True):
            out[i] = g
        if u["scale_local_gradients"] and len(shared) < len(variables):
            n = float(u["process_set"].size())
            for i, (g, v) in enumerate(zip(grads, variables, strict=True)):
                if g is None or id(v) not in local:
                    continue
                if isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                else:
                    out[i] = g / n
        return out

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        base_apply = super().apply_gradients  # type: ignore[misc]
        agg = self._agg_helper
        if agg is None:
            return base_apply(grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)  # read by whichever branch runs
        iterations = self.iterations  # type: ignore[attr-defined]  # made outside the branches

        def apply() -> Any:
            base_apply(pairs, *args, **kwargs)
            return iterations.read_value()

        def skip() -> Any:
            return iterations.assign_add(1).read_value()

        return agg.apply(apply, skip)

    def _compute_gradients(
        self, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None
    ) -> list[tuple[Any, Any]]:
        base = super()
        if hasattr(base, "_compute_gradients"):  # the legacy optimizers
            pairs = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        else:
            pairs = base.compute_gradients(loss, var_list, tape=tape)  # type: ignore[attr-defined]
        return self._unison_reduce(pairs)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> Any:
        return self._compute_gradients(loss, var_list, None, tape)

    def get_gradients(self, loss: Any, params: Any) -> Any:
        grads = super().get_gradients(loss, params)  # type: ignore[misc]
        return [g for g, _ in self._unison_reduce(zip(grads, params, strict=True))]


def _is_keras2_optimizer(opt: Any) -> bool:
    legacy = getattr(_keras.optimizers, "legacy", None)
    kinds = [_keras.optimizers.Optimizer]
    if legacy is not None:
        kinds.append(legacy.Optimizer)
    return isinstance(opt, tuple(kinds))


def _install(
    opt: Any,
    compression: Any,
    sparse_as_dense: bool,
    op: Any,
    gradient_predivide_factor: float,
    num_groups: int,
    groups: Any,
    process_set: ProcessSet,
    scale_local_gradients: bool,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
) -> Any:
    reduce = make_allreduce_grads_fn(
        compression or Compression.none, sparse_as_dense, op, gradient_predivide_factor,
        num_groups, groups, process_set,
    )  # fmt: skip
    passes = check_passes(backward_passes_per_step)
    aggregation = None
    if passes > 1:
        aggregation = LocalGradientAggregation(
            passes, sparse_as_dense, average_aggregated_gradients
        )
    cls = type(opt)
    if not issubclass(cls, _Distributed):
        new = type(cls.__name__, (_Distributed, cls), {})
        new.__module__ = cls.__module__  # saves (and loads) as the plain optimizer
        opt.__class__ = new
    opt.unison_configure(reduce, process_set, scale_local_gradients, aggregation)
    return opt


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = HvdOp.AVERAGE,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """A copy of the Keras 2 ``optimizer`` that averages (``op``) the gradients over the
    process set before applying them. With ``backward_passes_per_step=N`` the gradients
    of N passes are summed locally and reduced once, and the variables are updated on
    every Nth pass only; the sum is applied as is unless ``average_aggregated_gradients``
    (then divided by N)."""
    if not _is_keras2_optimizer(optimizer):
        raise ValueError(
            "unison.tensorflow.keras.DistributedOptimizer wraps a tf.keras optimizer, got "
            f"{type(optimizer).__name__}"
        )
    check_passes(backward_passes_per_step)
    base = type(optimizer)
    if issubclass(base, _Distributed):
        base = base.__mro__[2]
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = base.from_config(config)
    return _install(
        new, compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
        process_set, scale_local_gradients, backward_passes_per_step,
        average_aggregated_gradients,
    )  # fmt: skip


def PartialDistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = HvdOp.AVERAGE,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """A :func:`DistributedOptimizer` that leaves the gradients of ``local_layers``'
    trainable weights unreduced: each worker applies its own."""
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, (list, tuple)):
        layers = list(local_layers)
    else:
        layers = [local_layers]
    if not all(isinstance(layer, _keras.layers.Layer) for layer in layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    opt = DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
    )  # fmt: skip
    for layer in layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def load_model(
    filepath: Any,
    custom_optimizers: Any = None,
    custom_objects: Any = None,
    compression: Any = Compression.none,
) -> Any:
    """``tf.keras.models.load_model`` whose compiled optimizer comes back distributed
    (with its state)."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = _keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None and _is_keras2_optimizer(opt):
        _install(opt, compression, False, HvdOp.AVERAGE, 1.0, 0, None, global_process_set, True)
    return model


# The callbacks: unison.keras' logic on Keras 2's Callback (Model.fit of tf_keras calls
# Keras 2's hooks, which Keras 3's Callback base does not all have).
class BroadcastGlobalVariablesCallback(
    _k3_callbacks.BroadcastGlobalVariablesCallback,
    _keras.callbacks.Callback,  # type: ignore[misc,name-defined]
):
    __doc__ = _k3_callbacks.BroadcastGlobalVariablesCallback.__doc__


class MetricAverageCallback(
    _k3_callbacks.MetricAverageCallback,
    _keras.callbacks.Callback,  # type: ignore[misc,name-defined]
):
    __doc__ = _k3_callbacks.MetricAverageCallback.__doc__


class LearningRateScheduleCallback(
    _k3_callbacks.LearningRateScheduleCallback,
    _keras.callbacks.Callback,  # type: ignore[misc,name-defined]
):
    __doc__ = _k3_callbacks.LearningRateScheduleCallback.__doc__


class LearningRateWarmupCallback(
    _k3_callbacks.LearningRateWarmupCallback,
    _keras.callbacks.Callback,  # type: ignore[misc,name-defined]
):
    __doc__ = _k3_callbacks.LearningRateWarmupCallback.__doc__
