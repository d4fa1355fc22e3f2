"""How one collective runs on ``tf.Tensor``: at once when eager, as a ``tf.py_function``
in a graph (``tf.function`` or a ``tf.compat.v1`` graph run by a ``Session``), with the
engine's errors raised as the TensorFlow errors Horovod's op kernels raise.

A collective is given as ``submit(inputs) -> finish``: ``submit`` hands the eager input
tensors to the engine (its argument errors raise at once), ``finish()`` waits and
returns the output tensors.

Errors: a mismatch between ranks (shapes, dtypes, ops) is TensorFlow's
``FailedPreconditionError``, eagerly and in a graph; a ``ValueError`` of the engine is
``InvalidArgumentError``. A ``tf.py_function`` can only raise TensorFlow errors of a few
codes (a ``FailedPreconditionError`` raised inside comes out as ``UnknownError``), so in
a graph the wait's error travels out of the ``py_function`` as a code and a message, and
a native op raises it: reading a resource variable that does not exist is TensorFlow's
own ``FailedPreconditionError``, and the variable's name is the engine's message.

Graph execution order: the ops of a ``tf.function`` that have side effects (every
collective here) run in program order, so every rank submits them in one order. A
``tf.compat.v1`` graph has no such order: TensorFlow's inter-op threads run ready ops in
any order, and a thread waiting in a collective that another rank has not started
holds its thread. Horovod's kernels are asynchronous and hold none; here each waiting
collective holds one inter-op thread, so :func:`ensure_inter_op_threads` gives sessions
a pool larger than the number of collectives a graph can have in flight (see
docs/tensorflow.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from ..horovod.errors import TensorMismatchError

__all__ = ["INTER_OP_THREADS", "ensure_inter_op_threads", "raise_eager", "run"]

#: inter-op threads of TensorFlow sessions created after ``import unison.tensorflow``
#: when neither the session's config nor ``TF_NUM_INTEROP_THREADS`` sets a number
INTER_OP_THREADS = 256

_OK, _PRECONDITION, _ARGUMENT, _OTHER = 0, 1, 2, 3

Finish = Callable[[], Sequence[Any]]
Submit = Callable[[list[tf.Tensor]], Finish]


def ensure_inter_op_threads() -> None:
    """Size the inter-op pool of later sessions (TensorFlow reads ``TF_NUM_INTEROP_THREADS``
    when it creates a session whose config leaves the number at 0): each collective
    waiting in a ``tf.compat.v1`` graph holds one of those threads."""
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(INTER_OP_THREADS))


def _classify(e: BaseException) -> int:
    if isinstance(e, (TensorMismatchError, tf.errors.FailedPreconditionError)):
        return _PRECONDITION
    if isinstance(e, (ValueError, TypeError, tf.errors.InvalidArgumentError)):
        return _ARGUMENT
    return _OTHER


def raise_eager(e: BaseException) -> None:
    """Raise the engine's error ``e`` as Horovod's kernels raise it (eager execution)."""
    code = _classify(e)
    if isinstance(e, tf.errors.OpError):
        raise e
    if code == _PRECONDITION:
        raise tf.errors.FailedPreconditionError(None, None, str(e)) from e
    if code == _ARGUMENT:
        raise tf.errors.InvalidArgumentError(None, None, str(e)) from e
    raise e


def _error_handle(code: tf.Tensor, message: tf.Tensor) -> tf.Tensor:
    """Inside a ``py_function``: raise the error ``code`` stands for, or (for a failed
    precondition, which a ``py_function`` cannot raise) return the handle of a variable
    that does not exist, named by the message; reading it raises the error natively."""
    text = message.numpy().decode("utf-8", "replace")
    c = int(code.numpy())
    if c == _ARGUMENT:
        raise ValueError(text)
    if c != _PRECONDITION:
        raise RuntimeError(text)
    return tf.raw_ops.VarHandleOp(
        dtype=tf.int32, shape=[], container="unison.tensorflow.error", shared_name=text
    )


def _raise_op(code: tf.Tensor, message: tf.Tensor) -> tf.Tensor:
    handle = tf.py_function(_error_handle, [code, message], tf.resource)
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)


def run(
    submit: Submit,
    inputs: Sequence[Any],
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[Any],
) -> list[tf.Tensor]:
    """The collective's outputs: computed now (eager) or the graph's tensors for them."""
    ins = [tf.convert_to_tensor(t) for t in inputs]
    if tf.executing_eagerly():
        try:
            return list(submit(ins)())
        except (TensorMismatchError, ValueError, TypeError) as e:
            raise_eager(e)
            raise  # pragma: no cover - raise_eager always raises

    dtypes = list(out_dtypes)

    def body(*xs: tf.Tensor) -> list[tf.Tensor]:
        finish = submit(list(xs))  # argument errors: InvalidArgumentError, as Horovod's
        try:
            outs = [tf.convert_to_tensor(o) for o in finish()]
            code, text = _OK, ""
        except Exception as e:  # travels out as a code; raised below by a native op
            outs = [tf.zeros([0], dt) for dt in dtypes]
            code, text = _classify(e), str(e) or type(e).__name__
        return [*outs, tf.constant(code, tf.int32), tf.constant(text)]

    body = tf.autograph.experimental.do_not_convert(body)
    res = tf.py_function(func=body, inp=ins, Tout=[*dtypes, tf.int32, tf.string])
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    outs, code, message = res[:-2], res[-2], res[-1]
    check = tf.cond(
        tf.equal(code, _OK),
        lambda: tf.constant(0, tf.int32),
        lambda: _raise_op(code, message),
    )
    with tf.control_dependencies([check]):
        outs = [tf.identity(o) for o in outs]
    for o, s in zip(outs, out_shapes, strict=True):
        if s is not None:
            o.set_shape(s)
    return outs
