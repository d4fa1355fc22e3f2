"""Cross-memory attach: copy straight between two processes' address spaces.

``process_vm_readv``/``process_vm_writev`` (Linux ≥ 3.2) move bytes from or to
another process's memory in one copy, without a shared segment in between —
the single-copy path OpenMPI's ``smsc/cma`` takes. The kernel allows it where
the caller may ptrace the target (same user; Yama's ``ptrace_scope`` ≤ 0, or the
target named us with ``PR_SET_PTRACER``). Whether it works between two ranks is
established at start-up by reading a token from the peer (:func:`probe`), never
assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np

__all__ = ["CmaError", "available", "probe", "read_from"]


class CmaError(OSError):
    """A cross-memory copy failed or came back short."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


_READV = _load()


def available() -> bool:
    return _READV is not None


def read_from(pid: int, remote_addr: int, dst: np.ndarray) -> None:
    """Copy ``dst.nbytes`` bytes at ``remote_addr`` in process ``pid`` into ``dst``."""
    n = int(dst.nbytes)
    if n == 0:
        return
    if _READV is None:
        raise CmaError("process_vm_readv is not available on this platform")
    base = dst.ctypes.data
    done = 0
    while done < n:
        local = _Iovec(base + done, n - done)
        remote = _Iovec(remote_addr + done, n - done)
        got = _READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # type: ignore[operator]
        if got <= 0:
            err = ctypes.get_errno()
            raise CmaError(err, f"process_vm_readv from pid {pid} failed (errno {err})")
        done += int(got)


def probe(pid: int, remote_addr: int, expected: bytes) -> bool:
    """Whether reading ``len(expected)`` bytes from the peer returns ``expected``."""
    buf = np.zeros(len(expected), np.uint8)
    try:
        read_from(pid, remote_addr, buf)
    except CmaError:
        return False
    return buf.tobytes() == expected
