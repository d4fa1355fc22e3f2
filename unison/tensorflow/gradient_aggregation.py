"""Horovod's ``backward_passes_per_step`` for an optimizer that sees every pass's
gradients (Keras 2's): each pass's gradients are added to local sums, the sums are
reduced over the workers only on the last pass of a step, and the optimizer applies
only then. Works eagerly and inside a ``tf.function`` (the choice is a ``tf.cond`` on a
counter variable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..horovod.aggregation import aggregated_gradient_factor, check_passes

__all__ = ["LocalGradientAggregation"]


class LocalGradientAggregation:
    """The local sums of ``backward_passes_per_step`` passes' gradients.

    ``counter`` (a ``tf.Variable``, Horovod's ``_agg_helper.counter``) is the number of
    passes summed since the last reduction: it runs 1, ..., passes - 1 and is back to 0
    once the passes of a step are reduced, which is when the optimizer applies."""

    def __init__(self, backward_passes_per_step: int, sparse_as_dense: bool, average: bool) -> None:
        self.passes = check_passes(backward_passes_per_step)
        self.factor = aggregated_gradient_factor(self.passes, average)
        self.sparse_as_dense = sparse_as_dense
        with tf.init_scope():
            self.counter = tf.Variable(0, trainable=False, dtype=tf.int32, name="agg_counter")
        self._sums: dict[int, Any] = {}

    def _sum_for(self, index: int, grad: Any) -> Any:
        acc = self._sums.get(index)
        if acc is None:
            if grad.shape.is_fully_defined():
                with tf.init_scope():
                    acc = tf.Variable(tf.zeros(grad.shape, grad.dtype), trainable=False)
            else:
                acc = tf.Variable(tf.zeros_like(grad), trainable=False)
            self._sums[index] = acc
        return acc

    def accumulate(self, grads: list[Any], reduce: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """Adds ``grads`` (one pass's, ``None`` where a variable has none) to the sums and
        returns them: on the step's last pass reduced by ``reduce`` (and scaled as
        ``average_aggregated_gradients`` says), the sums and the counter then cleared (an
        infinite gradient does not outlive its step); on the other passes the sums so far,
        unreduced. IndexedSlices are summed dense (``sparse_as_dense``), else refused."""
        summed: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                summed.append(None)
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError(
                        "IndexedSlices are not supported when backward_passes_per_step > 1 "
                        "and sparse_as_dense is False"
                    )
                g = tf.convert_to_tensor(g)
            acc = self._sum_for(i, g)
            acc.assign_add(g)
            summed.append(acc.read_value())
        self.counter.assign_add(1)
        present = [i for i, g in enumerate(summed) if g is not None]
        if not present:
            self._restart_if_last()
            return summed

        def last_pass() -> list[Any]:
            reduced = reduce(list(summed))
            out = [reduced[i] for i in present]
            if self.factor != 1.0:
                out = [g * tf.cast(self.factor, g.dtype) for g in out]
            with tf.control_dependencies(out):
                self._clear()
            return [tf.identity(g) for g in out]

        def other_pass() -> list[Any]:
            return [tf.identity(summed[i]) for i in present]

        chosen = tf.cond(tf.equal(self.counter, self.passes), last_pass, other_pass)
        result: list[Any] = [None] * len(summed)
        for i, g in zip(present, chosen, strict=True):
            result[i] = g
        return result

    def _restart_if_last(self) -> None:
        tf.cond(
            tf.equal(self.counter, self.passes),
            lambda: self.counter.assign(0).read_value(),
            lambda: self.counter.read_value(),
        )

    def _clear(self) -> None:
        self.counter.assign(0)
        for acc in self._sums.values():
            acc.assign(tf.zeros_like(acc))

    def apply(self, apply_fn: Callable[[], Any], skip_fn: Callable[[], Any]) -> Any:
        """``apply_fn()`` where the step's passes were just reduced, else ``skip_fn()``
        (the two return values of one structure)."""
        return tf.cond(tf.equal(self.counter, 0), apply_fn, skip_fn)
