"""Several arrays of one dtype used as one: the 1-D array they make laid end to end.

An all-reduce of many tensors (Horovod's fused batches) would otherwise copy them into
one fusion buffer and back. The shared-memory algorithms copy their input into the
shared slots and their result out of them anyway, so they can read and write the
tensors where they lie: :class:`Pieces` gives them the logical array's ranges as the
views of the pieces they cover.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate, pairwise

import numpy as np

from .copy import copy_into

__all__ = ["Pieces", "overlapping", "pieces_pair"]


class Pieces:
    """The arrays ``arrays`` (contiguous, one dtype, any shape) as one 1-D array of
    :attr:`count` elements, the first array's elements first."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        if not arrays:
            raise ValueError("Pieces needs at least one array")
        self.dtype = arrays[0].dtype
        flat = []
        for a in arrays:
            if a.dtype != self.dtype or not a.flags.c_contiguous:
                raise ValueError("Pieces takes contiguous arrays of one dtype")
            flat.append(a if a.ndim == 1 else a.reshape(-1))
        self.arrays = flat
        #: where each piece starts in the logical array (and, last, the count)
        self.starts = [0, *accumulate(len(a) for a in flat)]
        self.count = self.starts[-1]
        self.nbytes = self.count * self.dtype.itemsize

    @classmethod
    def of(cls, arr: np.ndarray) -> Pieces:
        """One array as pieces (its ranges are plain slices)."""
        return cls([arr])

    def spans(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """The logical range ``[start, stop)`` as ``(offset from start, view)`` pairs,
        in order, empty pieces left out."""
        if len(self.arrays) == 1:
            return [(0, self.arrays[0][start:stop])] if stop > start else []
        out: list[tuple[int, np.ndarray]] = []
        i = bisect.bisect_right(self.starts, start) - 1
        pos = start
        while pos < stop and i < len(self.arrays):
            s = self.starts[i]
            end = min(stop, self.starts[i + 1])
            if end > pos:
                out.append((pos - start, self.arrays[i][pos - s : end - s]))
                pos = end
            i += 1
        return out

    def view(self, start: int, stop: int) -> np.ndarray | None:
        """The logical range ``[start, stop)`` as one view, where one piece holds it all."""
        sp = self.spans(start, stop)
        if len(sp) == 1:
            return sp[0][1]
        return None if sp else self.arrays[0][:0]

    def read(self, start: int, out: np.ndarray) -> None:
        """``out[:] = logical[start : start + len(out)]``."""
        for off, v in self.spans(start, start + len(out)):
            copy_into(out[off : off + len(v)], v)

    def write(self, start: int, src: np.ndarray) -> None:
        """``logical[start : start + len(src)] = src``."""
        for off, v in self.spans(start, start + len(src)):
            copy_into(v, src[off : off + len(v)])


def _extent(a: np.ndarray) -> tuple[int, int]:
    p = a.__array_interface__["data"][0]
    return p, p + a.nbytes


def overlapping(src: Pieces, dst: Pieces) -> bool:
    """Whether an all-reduce from ``src`` into ``dst`` piece by piece could read what it
    already wrote: some memory belongs to two pieces, other than a piece of ``src`` and
    the piece of ``dst`` at the same place (an in-place operation)."""
    if src.starts != dst.starts:
        return True
    spans = [_extent(a) for a in src.arrays if a.nbytes]
    for a, b in zip(src.arrays, dst.arrays, strict=True):
        if b.nbytes and b is not a:
            e = _extent(b)
            if e != _extent(a):
                spans.append(e)
    spans.sort()
    return any(b[0] < a[1] for a, b in pairwise(spans))


def pieces_pair(
    srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray]
) -> tuple[Pieces, Pieces] | None:
    """``srcs`` and ``dsts`` as the pieces an all-reduce reads and writes where they lie
    (``dsts[i]`` may be ``srcs[i]``: in place); None where it cannot: arrays not
    contiguous or of several dtypes, or memory shared as :func:`overlapping` says."""
    try:
        src = Pieces(srcs)
        dst = src if all(d is s for d, s in zip(dsts, srcs, strict=True)) else Pieces(dsts)
    except ValueError:
        return None
    if overlapping(src, dst):
        return None
    return src, dst
