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
import json
import os
import platform
import sys
from typing import Any

from .. import config as C
from .._version import __version__

__all__ = [
    "cma_available",
    "config_facts",
    "configure_parser",
    "facts",
    "main",
    "report",
    "shm_available",
]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="store_true",
        help="also print every UNISON_* knob with its value and meaning",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the same facts as one JSON object (versions, transports, backends, "
        "knobs) for scripts",
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


def facts() -> dict[str, Any]:
    """What this installation can do, as data (``unison info --json``)."""
    import numpy

    torch = _module("torch")
    mpi4py = _module("mpi4py")
    dist = _module("torch.distributed") if torch else None
    usable = bool(dist is not None and dist.is_available())
    torch_backends: dict[str, bool] = {}
    if usable:
        assert dist is not None
        for name in ("gloo", "nccl", "mpi"):
            probe = getattr(dist, f"is_{name}_available", None)
            torch_backends[name] = bool(probe and probe())
    return {
        "unison": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "numpy": numpy.__version__,
        "torch": torch.__version__ if torch else None,
        "mpi4py": mpi4py.__version__ if mpi4py else None,
        "transports": {"tcp": True, "shm": shm_available(), "cma": cma_available()},
        "backends": {"native": True, "mpi": mpi4py is not None, "torch": usable},
        "torch_backends": torch_backends,
    }


def report(*, with_config: bool = False) -> list[str]:
    """The lines ``unison info`` prints."""
    f = facts()
    lines = [
        f"unison {f['unison']}",
        f"python {f['python']} ({f['executable']})",
        f"numpy {f['numpy']}",
        f"torch {f['torch']}" if f["torch"] else "torch: not installed",
        f"mpi4py {f['mpi4py']}" if f["mpi4py"] else "mpi4py: not installed",
    ]

    def mark(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    t = f["transports"]
    lines.append("transports:")
    lines.append(f"  {mark(t['tcp'])} tcp")
    lines.append(f"  {mark(t['shm'])} shm (/dev/shm writable)")
    lines.append(f"  {mark(t['cma'])} cma (process_vm_readv cross-memory attach)")
    b = f["backends"]
    lines.append("backends:")
    lines.append(f"  {mark(b['native'])} native")
    lines.append(f"  {mark(b['mpi'])} mpi (mpi4py)")
    lines.append(f"  {mark(b['torch'])} torch (torch.distributed)")
    for name, ok in f["torch_backends"].items():
        lines.append(f"      {mark(ok)} {name}")
    if with_config:
        lines.extend(config_lines())
    return lines


def config_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The knobs' values (``None``: default), job identity and ignored variables."""
    env = dict(os.environ) if env is None else env
    knobs: dict[str, Any] = {}
    for knob in C.KNOBS:
        raw = env.get(knob.env)
        try:
            value = knob.parse(raw) if raw else knob.default
        except ValueError as exc:
            value = f"INVALID {raw!r}: {exc}"
        knobs[knob.env] = {"value": value, "set": bool(raw), "doc": knob.doc}
    identity = {
        name: ("<hidden>" if name == C.ENV_SECRET and name in env else env.get(name))
        for name in C.identity_docs()
    }
    return {
        "knobs": knobs,
        "identity": identity,
        "horovod_aliases": dict(C.HOROVOD_ALIASES),
        "ignored": dict(C.ignored_variables(env)),
    }


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
    lines.append("Horovod's variables read where the UNISON_* one is unset:")
    for horovod, ours in C.HOROVOD_ALIASES.items():
        lines.append(f"  {horovod:<{width}} -> {ours}")
    ignored = C.ignored_variables(env)
    if ignored:
        lines.append("variables that change nothing here:")
        lines.extend(f"  {why}" for _, why in ignored)
    return lines


def main(args: argparse.Namespace) -> int:
    if args.json:
        data = facts()
        if args.config:
            data["config"] = config_facts()
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return 0
    for line in report(with_config=args.config):
        print(line)
    return 0
