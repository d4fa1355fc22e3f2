"""The dtype table: every element type unison moves, with its wire code.

bfloat16 has no numpy type; it travels as 16-bit storage and is reduced through
torch (the only source of bfloat16 buffers).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["DType", "from_name", "from_numpy"]


class DType(enum.IntEnum):
    """Element types; the value is the code carried in frame headers."""

    BOOL = 1
    UINT8 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    INT64 = 6
    FLOAT16 = 7
    BFLOAT16 = 8
    FLOAT32 = 9
    FLOAT64 = 10

    @property
    def storage(self) -> np.dtype:
        """The numpy dtype holding the bytes (int16 storage for bfloat16)."""
        return _STORAGE[self]

    @property
    def itemsize(self) -> int:
        return int(_STORAGE[self].itemsize)

    @property
    def is_floating(self) -> bool:
        return self in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def is_bitwise_ok(self) -> bool:
        """Integer and boolean types accept BAND/BOR/BXOR."""
        return not self.is_floating

    @property
    def label(self) -> str:
        return self.name.lower()


_STORAGE: dict[DType, np.dtype] = {
    DType.BOOL: np.dtype(np.bool_),
    DType.UINT8: np.dtype(np.uint8),
    DType.INT8: np.dtype(np.int8),
    DType.INT16: np.dtype(np.int16),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.FLOAT16: np.dtype(np.float16),
    DType.BFLOAT16: np.dtype(np.int16),
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT64: np.dtype(np.float64),
}

_FROM_NUMPY: dict[np.dtype, DType] = {
    dt: code for code, dt in _STORAGE.items() if code is not DType.BFLOAT16
}


def from_numpy(dtype: np.dtype) -> DType | None:
    """The unison dtype of a numpy dtype (native byte order only), or None."""
    if not dtype.isnative:
        return None
    return _FROM_NUMPY.get(np.dtype(dtype))


def from_name(name: str) -> DType | None:
    """The unison dtype named ``name`` (its :attr:`DType.label`, e.g. ``"float32"``,
    ``"bfloat16"``; a framework's prefix such as ``"torch."`` or ``"tf."`` is ignored),
    or None: one table for every framework's dtype names."""
    label = name.rpartition(".")[2].lower()
    label = {"bool_": "bool", "half": "float16", "float": "float32", "double": "float64"}.get(
        label, label
    )
    try:
        return DType[label.upper()]
    except KeyError:
        return None
