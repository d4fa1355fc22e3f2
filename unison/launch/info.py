"""``unison info``: what this installation can do (like ``horovodrun --check-build``).

Versions, transports and backends available here; ``--config`` lists every
``UNISON_*`` knob with its current value and meaning. torch and mpi4py are imported
only by this command, never by ``unison run``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib
import os
import platform
import sys
from typing import Any

from .. import config as C
from .._version import __version__

__all__ = ["cma_available", "configure_parser", "main", "report", "shm_available"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="store_true",
        help="also print every UNISON_* knob with its value and meaning",
    )


def shm_available() -> bool:
    return os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def cma_available() -> bool:
    """Whether ``process_vm_readv`` works here (tried on this very process)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return False
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    src = ctypes.create_string_buffer(b"unison", 8)
    dst = ctypes.create_string_buffer(8)
    local = _IoVec(ctypes.cast(dst, ctypes.c_void_p), 8)
    remote = _IoVec(ctypes.cast(src, ctypes.c_void_p), 8)
    n = fn(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return bool(n == 8 and dst.raw[:6] == b"unison")


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # an installed-but-broken package counts as absent
        return None


def report(*, with_config: bool = False) -> list[str]:
    """The lines ``unison info`` prints."""
    import numpy

    lines = [
        f"unison {__version__}",
        f"python {platform.python_version()} ({sys.executable})",
        f"numpy {numpy.__version__}",
    ]
    torch = _module("torch")
    mpi4py = _module("mpi4py")
    lines.append(f"torch {torch.__version__}" if torch else "torch: not installed")
    lines.append(f"mpi4py {mpi4py.__version__}" if mpi4py else "mpi4py: not installed")

    def mark(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    lines.append("transports:")
    lines.append(f"  {mark(True)} tcp")
    lines.append(f"  {mark(shm_available())} shm (/dev/shm writable)")
    lines.append(f"  {mark(cma_available())} cma (process_vm_readv cross-memory attach)")
    lines.append("backends:")
    lines.append(f"  {mark(True)} native")
    lines.append(f"  {mark(mpi4py is not None)} mpi (mpi4py)")
    dist = _module("torch.distributed") if torch else None
    usable = bool(dist is not None and dist.is_available())
    lines.append(f"  {mark(usable)} torch (torch.distributed)")
    if usable:
        assert dist is not None
        for name in ("gloo", "nccl", "mpi"):
            probe = getattr(dist, f"is_{name}_available", None)
            lines.append(f"      {mark(bool(probe and probe()))} {name}")
    if with_config:
        lines.extend(config_lines())
    return lines


def config_lines(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    lines = ["configuration (UNISON_* knobs):"]
    width = max(len(k.env) for k in C.KNOBS)
    for knob in C.KNOBS:
        raw = env.get(knob.env)
        if raw is None or raw == "":
            shown = f"{knob.default!r} (default)"
        else:
            try:
                shown = repr(knob.parse(raw))
            except ValueError as exc:
                shown = f"{raw!r} (INVALID: {exc})"
        lines.append(f"  {knob.env:<{width}} = {shown}")
        lines.append(f"  {'':<{width}}   {knob.doc}")
    lines.append("job identity (set by launchers):")
    for name, doc in C.identity_docs().items():
        value = env.get(name)
        shown = "(unset)" if value is None else ("<hidden>" if name == C.ENV_SECRET else value)
        lines.append(f"  {name:<{width}} = {shown}    {doc}")
    unknown = C.unknown_variables(env)
    if unknown:
        lines.append(f"unknown UNISON_* variables (typos?): {', '.join(unknown)}")
    return lines


def main(args: argparse.Namespace) -> int:
    for line in report(with_config=args.config):
        print(line)
    return 0
