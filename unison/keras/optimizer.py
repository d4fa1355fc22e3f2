"""``DistributedOptimizer`` for Keras 3 optimizers (every backend) and ``load_model``."""

from __future__ import annotations

from typing import Any

import keras

from ..horovod.aggregation import aggregated_gradient_factor, check_passes
from ..horovod.basics import ProcessSet, global_process_set
from ..horovod.negotiation import HvdOp
from ._engine import allreduce_grads

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "load_model"]


class _Variables:
    """Variables the wrapper refers to, held outside Keras' tracking of the optimizer's
    attributes (which would save them as the optimizer's own)."""

    def __init__(self) -> None:
        self.local: dict[int, Any] = {}
        self.applying: list[Any] | None = None


class _Distributed:
    """Mixed in before the wrapped optimizer's class: the gradients that reach the update
    (after Keras' own accumulation over ``backward_passes_per_step``) are reduced over the
    process set first, then clipped and applied as usual."""

    _unison: dict[str, Any]

    def register_local_var(self, var: Any) -> None:
        """``var``'s gradient stays this worker's own: it is not reduced (and, with
        ``scale_local_gradients``, it is divided by the set's size, as Horovod does)."""
        self._unison["vars"].local[id(var)] = var

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> Any:
        # the variables the gradients belong to, for _clip_gradients (same order)
        self._unison["vars"].applying = list(trainable_variables)
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)  # type: ignore[misc]
        finally:
            self._unison["vars"].applying = None

    def _clip_gradients(self, grads: Any) -> Any:
        u = self._unison
        grads = list(grads)
        steps = u["backward_passes_per_step"]
        if steps > 1:
            # Keras hands over the mean of the accumulated gradients (their sum / steps)
            scale = steps * aggregated_gradient_factor(steps, u["average_aggregated_gradients"])
            if scale != 1.0:
                grads = [g if g is None else g * scale for g in grads]
        variables = u["vars"].applying
        local = u["vars"].local
        if local and variables is not None and len(variables) == len(grads):
            mine = {i for i, v in enumerate(variables) if id(v) in local}
        else:
            mine = set()
        shared = [i for i in range(len(grads)) if i not in mine]
        reduced = allreduce_grads(
            [grads[i] for i in shared], u["op"], u["prescale"], u["postscale"],
            u["compression"], u["sparse_as_dense"], u["process_set"],
        )  # fmt: skip
        for i, g in zip(shared, reduced, strict=True):
            grads[i] = g
        if mine and u["scale_local_gradients"]:
            n = float(u["process_set"].size())
            for i in mine:
                if grads[i] is not None:
                    grads[i] = grads[i] / n
        return super()._clip_gradients(grads)  # type: ignore[misc]


def _wrap_class(cls: type) -> type:
    if issubclass(cls, _Distributed):
        return cls
    new = type(cls.__name__, (_Distributed, cls), {})
    new.__module__ = cls.__module__  # saves (and loads) as the plain optimizer
    return new


def _install(
    opt: Any,
    compression: Any,
    sparse_as_dense: bool,
    gradient_predivide_factor: float,
    op: Any,
    backward_passes_per_step: int,
    average_aggregated_gradients: bool,
    process_set: ProcessSet,
    scale_local_gradients: bool = True,
) -> Any:
    rop = HvdOp(int(op))
    if gradient_predivide_factor != 1.0:
        if rop != HvdOp.AVERAGE:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        pre, post = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        pre = post = 1.0
    opt.__class__ = _wrap_class(type(opt))
    opt._unison = dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=rop, prescale=pre,
        postscale=post, backward_passes_per_step=int(backward_passes_per_step),
        average_aggregated_gradients=bool(average_aggregated_gradients), process_set=process_set,
        scale_local_gradients=bool(scale_local_gradients), vars=_Variables(),
    )  # fmt: skip
    return opt


def _keras2_front(optimizer: Any) -> Any:
    """The Keras 2 front (:mod:`unison.tensorflow.keras.keras2`) where ``optimizer`` is
    one of ``tf_keras``' (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``, which Horovod's
    ``horovod.keras`` served as it serves Keras 3's), else None."""
    if str(type(optimizer).__module__).split(".")[0] != "tf_keras":
        return None
    from ..tensorflow.keras import keras2

    return keras2


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
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
    """A copy of ``optimizer`` (a ``keras.optimizers.Optimizer``) that averages (``op``)
    gradients over the process set before applying them. With
    ``backward_passes_per_step=N`` gradients are aggregated locally over N steps
    (Keras' ``gradient_accumulation_steps``) and reduced once; they are summed unless
    ``average_aggregated_gradients``. A ``tf_keras`` optimizer is wrapped by the Keras 2
    front."""
    arguments = dict(locals())  # Horovod's argument list, forwarded whole to Keras 2
    k2 = _keras2_front(optimizer)
    if k2 is not None:
        return k2.DistributedOptimizer(**arguments)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"unison.keras.DistributedOptimizer wraps a keras.optimizers.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    backward_passes_per_step = check_passes(backward_passes_per_step)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
    base = type(optimizer)
    if issubclass(base, _Distributed):
        base = base.__mro__[2]
    new = base.from_config(config)
    return _install(
        new, compression, sparse_as_dense, gradient_predivide_factor, op,
        backward_passes_per_step, average_aggregated_gradients, process_set,
        scale_local_gradients,
    )  # fmt: skip


def PartialDistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
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
    arguments = dict(locals())  # Horovod's argument list, forwarded whole to Keras 2
    k2 = _keras2_front(optimizer)
    if k2 is not None:
        return k2.PartialDistributedOptimizer(**arguments)
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, (list, tuple)):
        layers = list(local_layers)
    else:
        layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
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
    compression: Any = None,
) -> Any:
    """``keras.models.load_model`` whose compiled optimizer comes back distributed (with
    its state)."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if isinstance(opt, keras.optimizers.Optimizer):
        _install(opt, compression, False, 1.0, HvdOp.AVERAGE, 1, False, global_process_set)
    return model
