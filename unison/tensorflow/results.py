"""Result arrays that TensorFlow takes without a copy, reused once it lets go of them.

An all-reduce's result must become a ``tf.Tensor``. Made the plain way -- a new
numpy array for the engine to write, then ``tf.convert_to_tensor``, which copies it
into memory TensorFlow allocates -- every training step writes its gradients twice
into freshly mapped pages, and the kernel's page faults on them cost more than the
reduction itself (a 25 MB gradient: tens of milliseconds). Here the engine writes
into an array of this pool and TensorFlow takes that memory as it is, through
DLPack. The pool hands an array out again only when nothing refers to its memory any
more: every numpy view of it (TensorFlow's DLPack import holds one until the tensor
is freed) counts as a reference to the array that owns the memory, so a block whose
only reference is the pool's own is free, whatever code held it and for how long.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import tensorflow as tf

from ..buffers import Buffer, DType
from ..horovod.arrays import numel
from ._bridge import from_buffer

__all__ = ["ALIGN", "ResultPool", "results"]

#: TensorFlow's CPU tensors start at a multiple of this many bytes; it aborts the
#: process when a kernel meets an imported buffer that does not
ALIGN = 64
#: free blocks of one size kept for later results (more are given back to the allocator)
_SPARE = 2


class ResultPool:
    """Blocks of memory for results, by size; see the module's text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: result bytes -> the uint8 arrays owning blocks of that size (ALIGN bytes more)
        self._blocks: dict[int, list[np.ndarray]] = {}

    def take(self, dtype: DType, shape: tuple[int, ...]) -> Buffer:
        """A buffer of ``shape`` for the engine to write a result into; its memory is
        this pool's until nothing refers to it."""
        nbytes = numel(shape) * dtype.storage.itemsize
        with self._lock:
            blocks = self._blocks.setdefault(nbytes, [])
            free = [i for i in range(len(blocks)) if sys.getrefcount(blocks[i]) == 2]
            for i in reversed(free[_SPARE:]):  # more spare blocks than a loop needs
                del blocks[i]
            if free:
                raw = blocks[free[0]]
            else:
                raw = np.empty(nbytes + ALIGN, np.uint8)
                blocks.append(raw)
        off = (-raw.ctypes.data) % ALIGN
        arr = raw[off : off + nbytes].view(dtype.storage).reshape(shape)
        return Buffer(arr.reshape(-1), dtype, arr)

    def tensor(self, b: Buffer, dtype: tf.DType) -> tf.Tensor:
        """The result ``b`` as a ``tf.Tensor`` of ``dtype``: this pool's memory itself
        where DLPack carries the dtype, else a copy."""
        a = b.array.reshape(b.shape)
        if a.size and dtype != tf.bfloat16 and self._owns(a):
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        return from_buffer(b, dtype)

    def _owns(self, a: np.ndarray) -> bool:
        """Whether ``a`` views one of this pool's blocks (the very array, not an id that
        a freed block's successor may reuse), at an aligned start."""
        base = a.base
        if not isinstance(base, np.ndarray) or a.ctypes.data % ALIGN:
            return False
        with self._lock:
            return any(base is blk for blk in self._blocks.get(base.nbytes - ALIGN, ()))


#: the process's pool (results of the TensorFlow front's all-reduces)
results = ResultPool()
