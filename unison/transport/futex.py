"""Futex wait/wake on a word of shared memory, through ``syscall(2)`` via ctypes.

A process that has nothing to do sleeps in ``FUTEX_WAIT`` on a 32-bit word of its
own segment (its *doorbell*); a peer that hands it work bumps the word and, only
when the sleeper has said it sleeps, calls ``FUTEX_WAKE``. The shared (not
``FUTEX_PRIVATE``) operations work across processes that map the same file.

Where the syscall is unavailable (not Linux, unknown architecture) :func:`wait`
falls back to a bounded ``time.sleep`` so callers stay correct, only slower.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import time

__all__ = ["available", "wait", "wake"]

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
#: syscall number of futex(2) per machine architecture
_NR_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238, "riscv64": 98}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[object | None, int]:
    if not sys.platform.startswith("linux"):
        return None, -1
    nr = _NR_FUTEX.get(platform.machine(), -1)
    if nr < 0:
        return None, -1
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None, -1
    fn.restype = ctypes.c_long
    return fn, nr


_SYSCALL, _NR = _load()


def available() -> bool:
    return _SYSCALL is not None


def wait(addr: int, expected: int, timeout: float) -> None:
    """Sleep while the u32 at ``addr`` equals ``expected``, at most ``timeout`` seconds.

    Returns on a wake, a changed value, a signal or the timeout (callers re-check).
    """
    if timeout <= 0:
        return
    if _SYSCALL is None:
        time.sleep(min(timeout, 0.001))
        return
    sec = int(timeout)
    ts = _Timespec(sec, int((timeout - sec) * 1e9))
    _SYSCALL(  # type: ignore[operator]
        _NR,
        ctypes.c_void_p(addr),
        _FUTEX_WAIT,
        ctypes.c_uint32(expected & 0xFFFFFFFF),
        ctypes.byref(ts),
        None,
        0,
    )


def wake(addr: int, count: int = 1) -> None:
    """Wake up to ``count`` processes sleeping on the u32 at ``addr``."""
    if _SYSCALL is not None:
        _SYSCALL(_NR, ctypes.c_void_p(addr), _FUTEX_WAKE, count, None, None, 0)  # type: ignore[operator]
