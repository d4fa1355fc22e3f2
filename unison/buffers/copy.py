"""Copies between user buffers and shared memory that avoid the 4 KiB-aliasing slow path.

``dst[:] = src`` ends in the C library's ``memmove``. For copies between about
2 KiB and the size of the L2 cache, glibc's ``memmove`` uses ``rep movsb`` on CPUs
that advertise fast string moves, and on some of them (AMD Zen among them) that
instruction runs an order of magnitude slower when the destination lies just
ahead of the source modulo the 4 KiB page (``(dst − src) mod 4096`` in
``1 … 63``: the stores alias loads still in flight). In unison this is the common
case, not a corner: a large numpy array comes from ``malloc``'s ``mmap`` path 16
bytes past a page boundary, while shared slots and rings start on page
boundaries, so a copy *out of* shared memory into such an array is a
short-distance copy (with glibc 2.36 on x86-64 it can take fifteen times as long as an
aligned one at 256 KiB; at 512 KiB and above, where ``memmove`` switches to
vector loops, no penalty).

:func:`copy_into` takes exactly those copies (short distance, size in that
window) through a ufunc loop on byte views: plain vector loads and stores, about
1.25× a good ``memmove`` and never the slow path. The test is on the two
addresses, so nothing is tuned to a machine; where ``rep movsb`` has no such slow
path the detour costs at most that 1.25× on those copies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NEAR_BYTES", "copy_bytes", "copy_into", "short_distance"]

_PAGE = 4096
#: destinations up to this many bytes ahead of the source (modulo a page) take the loop
NEAR_BYTES = 64
#: below this the address test costs more than the slow path loses
_SMALL = 16 << 10


def _l2_bytes() -> int:
    """The L2 cache size (where glibc stops using ``rep movsb`` on AMD); 1 MiB unknown."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        return int(text.rstrip("KM")) * mult
    except (OSError, ValueError):
        return 1 << 20


_LARGE = max(_SMALL, _l2_bytes())


def short_distance(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether ``dst`` starts 1…63 bytes ahead of ``src`` modulo a 4 KiB page."""
    a: int = dst.__array_interface__["data"][0]
    b: int = src.__array_interface__["data"][0]
    d = (a - b) % _PAGE
    return 0 < d < NEAR_BYTES


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for arrays of one dtype and shape, avoiding the slow
    short-distance ``memmove`` (see the module docstring)."""
    if (
        _SMALL <= dst.nbytes < _LARGE
        and dst.flags.c_contiguous
        and src.flags.c_contiguous
        and dst.dtype == src.dtype
        and dst.shape == src.shape
        and short_distance(dst, src)
    ):
        np.positive(src.view(np.uint8), out=dst.view(np.uint8))
        return
    dst[...] = src


def copy_bytes(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` for byte memoryviews of one length (the shm rings' pieces), through
    :func:`copy_into` where the short-distance slow path could apply."""
    if _SMALL <= len(dst) < _LARGE:
        copy_into(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src
