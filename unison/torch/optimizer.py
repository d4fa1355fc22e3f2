"""DistributedOptimizer: the user's optimizer, wrapped by composition.

Each parameter's gradient is all-reduced in the background as soon as autograd
has accumulated it (``register_post_accumulate_grad_hook``), so the reduction of
late layers overlaps the backward pass of early ones; ``step()`` waits for the
reductions, writes the averaged gradients back and calls the wrapped optimizer.

The wrapper is a ``torch.optim.Optimizer`` (LR schedulers accept it) whose
``param_groups``, ``state`` and ``defaults`` are the wrapped optimizer's own.

Overlap needs a core for the engine beside the backward pass. Where a rank has
none (this host's ranks have a core each or less, and the parameters are on the
CPU), a reduction started during the backward pass only takes turns with it on the
one core, and the gradients trickle into several negotiation cycles and fused
operations per step. There, by default (``UNISON_GRADIENT_OVERLAP=auto``), the hooks
only note which gradients are final and ``step()`` (``synchronize()``) reduces all
of them as one group: one cycle, one fused operation. The results are the same.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..horovod.basics import engine_has_core
from ..horovod.negotiation import HvdOp
from .basics import ProcessSet, global_process_set, settings
from .collectives import sparse_allreduce_async
from .compression import Compression, Compressor
from .ops import Average, allreduce_async_, grouped_allreduce_async_, synchronize

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer"]


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Any,
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: HvdOp,
        gradient_predivide_factor: float,
        groups: Any,
        sparse_as_dense: bool,
        process_set: ProcessSet,
    ) -> None:
        # Deliberately no super().__init__: the wrapped optimizer owns every piece of state.
        object.__setattr__(self, "_unison_inner", optimizer)
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._parameter_names: dict[Any, str] = {}
        self._names = self._check_names(named_parameters)
        self._groups = self._make_groups(groups)
        self._group_of = {p: i for i, g in enumerate(self._groups or []) for p in g}
        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._hooks: list[Any] = []
        self._ready: dict[int, set[Any]] = {}
        self._synchronized = False
        self._should_synchronize = True
        self.backward_passes_per_step = backward_passes_per_step
        self._delay: dict[Any, int] = {}
        self._requires_update: set[Any] = set()
        self._local_vars: set[Any] = set()
        self.scale_local_gradients = True
        #: reduce every gradient at synchronize() as one group instead of in the hooks
        self._defer = self._groups is None and not _overlaps(self._all_params())
        if process_set.included():
            self._register_hooks()
        self.set_backward_passes_per_step(backward_passes_per_step)

    # --- the wrapped optimizer's state ------------------------------------------------------
    @property
    def param_groups(self) -> Any:
        return self._unison_inner.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._unison_inner.param_groups = value

    @property
    def state(self) -> Any:
        return self._unison_inner.state

    @state.setter
    def state(self, value: Any) -> None:
        self._unison_inner.state = value

    @property
    def defaults(self) -> Any:
        return self._unison_inner.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._unison_inner.defaults = value

    def __getattr__(self, name: str) -> Any:
        if name == "_unison_inner":
            raise AttributeError(name)
        return getattr(self._unison_inner, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._unison_inner!r})"

    def state_dict(self) -> Any:
        return self._unison_inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # as Horovod: forget reductions in flight and restart the accumulation count
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._requires_update:
            self._delay[p] = self.backward_passes_per_step
        self._unison_inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._unison_inner.add_param_group(param_group)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a DistributedOptimizer cannot be pickled; pickle its state_dict()")

    # --- set-up -------------------------------------------------------------------------------
    def _all_params(self) -> list[Any]:
        return [p for g in self.param_groups for p in g["params"]]

    def _check_names(self, named_parameters: Any) -> dict[Any, str]:
        """The tensor names of the reductions; sets ``_parameter_names`` (parameter -> name)
        as Horovod does: the given names, or ``allreduce.noname.<group>.<index>``."""
        if named_parameters is None:
            self._parameter_names = {
                p: f"allreduce.noname.{i}.{j}"
                for i, g in enumerate(self.param_groups)
                for j, p in enumerate(g["params"])
            }
            return dict(self._parameter_names)
        named = list(named_parameters)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
            raise ValueError(
                "named_parameters must be a sequence of (name, parameter) tuples, usually "
                "model.named_parameters()"
            )
        counts: dict[str, int] = {}
        for n, _ in named:
            counts[n] = counts.get(n, 0) + 1
        dups = sorted(n for n, c in counts.items() if c > 1)
        if dups:
            raise ValueError(
                f"parameter names in named_parameters must be unique; duplicates: {', '.join(dups)}"
            )
        known = {id(p) for _, p in named}
        unnamed = [id(p) for p in self._all_params() if id(p) not in known]
        if unnamed:
            raise ValueError(
                "named_parameters was given, but some parameters of the optimizer are not in it "
                f"(Python object ids: {', '.join(map(str, unnamed))})"
            )
        self._parameter_names = {p: n for n, p in sorted(named, key=lambda x: x[0])}
        return {p: f"allreduce.{n}" for n, p in named}

    def _make_groups(self, groups: Any) -> list[list[Any]] | None:
        if groups is None:
            return None
        params = [p for p in self._all_params() if p.requires_grad]
        if isinstance(groups, int):
            if groups <= 0:
                return None
            k = -(-len(params) // groups)
            return [params[i : i + k] for i in range(0, len(params), k)]
        out = [list(g) for g in groups]
        grouped = {id(p) for g in out for p in g}
        out += [[p] for p in params if id(p) not in grouped]
        return out

    def _register_hooks(self) -> None:
        for p in self._all_params():
            if p.requires_grad:
                self._requires_update.add(p)
                self._hooks.append(p.register_post_accumulate_grad_hook(self._hook))

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self.backward_passes_per_step = passes
        for p in self._requires_update:
            self._delay[p] = passes

    # --- hooks and reductions -------------------------------------------------------------------
    def register_local_var(self, var: torch.Tensor) -> None:
        """Horovod's model-parallel hook: ``var``'s gradient stays local (never reduced);
        with ``scale_local_gradients`` it is divided by the process set's size."""
        if not any(var is p for p in self._all_params()):
            raise ValueError("register_local_var: the tensor is not a parameter of this optimizer")
        self._local_vars.add(var)
        self._requires_update.discard(var)
        self._handles.pop(var, None)
        if self._groups is not None:
            self._groups = [[p for p in g if p is not var] for g in self._groups]
            self._groups = [g for g in self._groups if g]
            self._group_of = {p: i for i, g in enumerate(self._groups) for p in g}

    def _hook(self, p: torch.Tensor) -> None:
        if p in self._local_vars:
            return
        if (
            p in self._handles
            and self._delay[p] <= 0
            and (self._handles[p][0] is not None or self._defer)
        ):
            raise AssertionError(
                "gradients were computed more than backward_passes_per_step times before "
                "step(); increase backward_passes_per_step to accumulate gradients locally"
            )
        self._delay[p] -= 1
        handle: Any = None
        ctx: Any = None
        if self._delay[p] == 0 and not self._defer:
            if self._groups is None:
                handle, ctx = self._reduce(p)
            else:
                gi = self._group_of.get(p)
                if gi is None:
                    handle, ctx = self._reduce(p)
                else:
                    ready = self._ready.setdefault(gi, set())
                    ready.add(p)
                    if len(ready) == len(self._groups[gi]):
                        self._reduce_group(gi)
                        self._ready.pop(gi)
                    return
        self._handles[p] = (handle, ctx)

    def _scales(self) -> tuple[float, float]:
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _reduce(self, p: Any) -> tuple[Any, Any]:
        name = self._names.get(p)
        grad = p.grad
        if grad is None:
            grad = p.grad = torch.zeros_like(p)
        if grad.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(grad, str(name), self.op, self.process_set), "sparse"
            # reduced densely; synchronize() writes the result back as a sparse gradient
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        pre, post = self._scales()
        h = allreduce_async_(
            compressed,
            name=name,
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=self.process_set,
        )
        return h, (compressed, ctx)

    def _reduce_group(self, gi: int) -> None:
        self._reduce_together(self._groups[gi])  # type: ignore[index]

    def _reduce_together(self, params: list[Any]) -> None:
        """All-reduce the gradients of ``params`` as one group (one fused operation)."""
        grads, ctxs = [], []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse:  # a group is reduced densely (sparse_as_dense or not)
                p.grad = p.grad.to_dense()
            c, ctx = self._compression.compress(p.grad)
            grads.append(c)
            ctxs.append(ctx)
        pre, post = self._scales()
        h = grouped_allreduce_async_(
            grads,
            name=f"grouped.{self._names[params[0]]}",
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=self.process_set,
        )
        self._handles[tuple(params)] = (h, (grads, ctxs))

    # --- the optimizer interface ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every gradient's reduction and write the results into ``.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        if self.scale_local_gradients and not self._synchronized:
            n = self.process_set.size()
            for p in self._local_vars:
                if p.grad is not None:
                    p.grad.div_(n)
        if self._defer:
            self._reduce_deferred()
        done: set[Any] = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        for p in self._requires_update - done:
            gi = self._group_of.get(p)
            if gi is not None and self._groups is not None:
                if not any(isinstance(k, tuple) and any(q is p for q in k) for k in self._handles):
                    self._reduce_group(gi)
                    self._ready.pop(gi, None)
                    done.update(self._groups[gi])
            else:
                self._handles[p] = self._reduce(p)
        for key, (handle, _ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[key] = self._reduce(key)
        for key, (handle, ctx) in self._handles.items():
            if ctx == "sparse":
                key.grad = synchronize(handle)
            elif isinstance(key, tuple):
                outs = synchronize(handle)
                _grads, ctxs = ctx
                for p, o, c in zip(key, outs, ctxs, strict=True):
                    self._write(p, o, c)
                    self._delay[p] = self.backward_passes_per_step
                continue
            else:
                out = synchronize(handle)
                if key.grad.is_sparse:  # sparse_as_dense: the optimizer still gets sparse
                    key.grad = self._compression.decompress(out, ctx[1]).to_sparse()
                else:
                    self._write(key, out, ctx[1])
            self._delay[key] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    def _reduce_deferred(self) -> None:
        """Without overlap: every gradient not yet submitted, in the optimizer's parameter
        order (the same groups on every rank, whichever hooks ran), one group per dtype;
        a sparse gradient goes alone (reduced sparsely, or densely and handed back
        sparse)."""
        by_dtype: dict[torch.dtype, list[Any]] = {}  # a group has one dtype
        for p in self._all_params():
            if p not in self._requires_update or self._handles.get(p, (None,))[0] is not None:
                continue
            self._handles.pop(p, None)
            if p.grad is not None and p.grad.is_sparse:  # its own path, as with overlap
                self._handles[p] = self._reduce(p)
            else:
                by_dtype.setdefault(p.dtype, []).append(p)
        for together in by_dtype.values():
            self._reduce_together(together)

    def _write(self, p: Any, out: torch.Tensor, ctx: Any) -> None:
        value = self._compression.decompress(out, ctx)
        if value.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(value)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside, ``step()`` does not synchronize (call :meth:`synchronize` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(  # Horovod's wording: scripts filter on it
                    "optimizer.step() called without "
                    "optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training "
                    "slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return self._unison_inner.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(  # Horovod's wording
                "optimizer.zero_grad() was called after loss.backward() "
                "but before optimizer.step() or optimizer.synchronize(). "
                "This is prohibited as it can cause a race condition."
            )
        self._unison_inner.zero_grad(set_to_none=set_to_none)


def _overlaps(params: list[Any]) -> bool:
    """Whether the hooks reduce gradients while the backward pass runs
    (``UNISON_GRADIENT_OVERLAP``: on, off, or auto: unless the parameters are on the CPU
    and the engine has no core of its own beside the computation)."""
    mode = settings().gradient_overlap
    if mode != "auto":
        return mode == "on"
    return engine_has_core() or any(p.device.type != "cpu" for p in params)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Sequence[Sequence[torch.Tensor]] | int | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so gradients are averaged (``op``) over the process set.

    ``gradient_predivide_factor`` splits the averaging: gradients are divided by
    it before the sum and by ``size / factor`` after. ``num_groups`` or ``groups``
    reduce parameters in fixed groups (each group as one fused operation).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    rop = HvdOp(int(op))
    if gradient_predivide_factor != 1.0 and rop != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if groups is not None and not (
        isinstance(groups, int)
        or (isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups))
    ):
        raise ValueError("groups must be an int or a list of lists of parameters")
    if isinstance(groups, int) and groups < 0:
        raise ValueError("groups must be >= 0")
    return _DistributedOptimizer(
        optimizer,
        named_parameters,
        compression,
        backward_passes_per_step,
        rop,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )


def PartialDistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    groups: Sequence[Sequence[torch.Tensor]] | int | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    local_layers: torch.nn.Module | Sequence[torch.nn.Module] | None = None,
    scale_local_gradients: bool = True,
) -> torch.optim.Optimizer:
    """Horovod's ``PartialDistributedOptimizer`` for model parallelism: a
    :func:`DistributedOptimizer` whose ``local_layers``' parameters keep their local
    gradients (registered with ``register_local_var``; divided by the process set's size
    when ``scale_local_gradients``, as Horovod does). The other gradients are reduced."""
    opt = DistributedOptimizer(
        optimizer,
        named_parameters=named_parameters,
        compression=compression,
        backward_passes_per_step=backward_passes_per_step,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        sparse_as_dense=sparse_as_dense,
        process_set=process_set,
    )
    assert isinstance(opt, _DistributedOptimizer)
    opt.scale_local_gradients = scale_local_gradients
    if local_layers is None:
        layers: list[torch.nn.Module] = []
    elif isinstance(local_layers, torch.nn.Module):
        layers = [local_layers]
    else:
        layers = list(local_layers)
    for layer in layers:
        if not isinstance(layer, torch.nn.Module):
            raise ValueError(
                f"local_layers must be torch.nn.Module objects, got {type(layer).__name__}"
            )
        for p in layer.parameters():
            opt.register_local_var(p)
    return opt
