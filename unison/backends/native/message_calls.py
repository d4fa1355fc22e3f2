"""Small blocking all-reduces by message, prepared once and run in the caller's thread.

A group without shared slots (ranks on several hosts, or TCP forced) moves every
collective by messages. A small blocking all-reduce is a few exchanges of a few bytes,
and the general path's layers around them (the Work, the turn, the task that runs the
body) are a good part of its time in Python. :meth:`Executor.run <.executor.Executor.run>`
runs a call prepared here straight in the caller's thread, when nothing else of the
group is in flight, on an operation context of its own: the algorithm the selector
chooses, on the same keys and signatures as the general path (so a peer on either path
meets it), with the same failure handling (the context is in flight, so other ranks'
aborts and lost peers reach it; a failure breaks the group and is told to every peer).

Only the all-reduce is prepared: the rooted collectives confirm their signature
(:mod:`.desync`), and the others were not measured this way. A group made like this does not claim
:attr:`~unison.comm.group.Group.caller_thread_collectives`, which promises every small
collective in the caller's thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._types import OpCode, OpSig, ReduceOp
from ...buffers import DType, Kernel, kernel

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["MessageCall", "prepare_message_call"]


class MessageCall:
    """One all-reduce signature's call by message: its signature, reduce op, dtype,
    kernel and bytes."""

    __slots__ = ("dtype", "kern", "nbytes", "rop", "sig")
    op = OpCode.ALL_REDUCE  # the one collective prepared here

    def __init__(self, sig: OpSig, rop: ReduceOp, dtype: DType, nbytes: int) -> None:
        self.sig, self.rop, self.dtype, self.nbytes = sig, rop, dtype, nbytes
        self.kern: Kernel = kernel(rop, dtype)


def prepare_message_call(
    ex: Executor, op: OpCode, count: int, nbytes: int, dtype: DType, redop: ReduceOp | None
) -> MessageCall | None:
    """The call of a validated signature, or None when it is not an all-reduce of at
    most :attr:`Executor.message_call_bytes` (``count`` elements, ``nbytes`` bytes)."""
    if op is not OpCode.ALL_REDUCE or redop is None or nbytes > ex.message_call_bytes:
        return None
    return MessageCall(ex.sig(op, dtype, count, redop=redop), redop, dtype, nbytes)
