"""Start rank processes so none can outlive the launcher, and end them.

Each rank runs in its own session (so its whole process group can be signalled) and
asks the kernel for ``SIGKILL`` when the launcher dies (``PR_SET_PDEATHSIG``), so
no orphan survives even a ``kill -9`` of the launcher. Exits are observed through
``pidfd`` descriptors in the launcher's selector: no polling.

A descendant that left the rank's session (``setsid()``, a daemonising library) is
out of reach of a process-group signal. While a job runs the launcher is a *child
subreaper* (``PR_SET_CHILD_SUBREAPER``): such orphans are re-parented to it, not to
init, and at the end :func:`end_leftovers` kills and reaps every process that still
carries the job's id in its environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .rankenv import binding_of

__all__ = [
    "Launch",
    "RankProcess",
    "become_subreaper",
    "describe_exit",
    "end_leftovers",
    "exit_status",
    "signal_name",
    "start_rank",
    "take_pipes",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return cast("Callable[..., int]", fn)


_PRCTL = _prctl()  # resolved before any fork: the child only calls it


def _preexec(parent: int, cpus: Sequence[int] | None = None) -> Callable[[], None]:
    """What the child runs before its command: die with the launcher, and run on ``cpus``
    (its binding, :func:`unison.launch.rankenv.cpu_share`) where given. Bound here, before
    the command starts, every thread and child process of the rank inherits the binding."""
    mask = frozenset(cpus) if cpus else None

    def run_in_child() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        if mask is not None:
            with contextlib.suppress(OSError):  # cores this host does not let us have
                os.sched_setaffinity(0, mask)

    return run_in_child


def become_subreaper() -> Callable[[], None]:
    """Make this process the reaper of its orphaned descendants; returns the undo."""
    prctl = _PRCTL
    if prctl is None:
        return lambda: None
    was = ctypes.c_int(0)
    with contextlib.suppress(Exception):
        prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(was), 0, 0, 0)
    if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return lambda: None
    previous = int(was.value)

    def undo() -> None:
        prctl(_PR_SET_CHILD_SUBREAPER, previous, 0, 0, 0)

    return undo


def end_leftovers(marker: str, spare: Sequence[int] = ()) -> list[int]:
    """SIGKILL every process of this user whose environment holds ``marker`` (``NAME=value``,
    the job's id), other than ``spare``; reap those that are this process's children
    (orphans re-parented here). Returns the pids killed."""
    want, me, killed = marker.encode(), os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spare or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if want in env:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    for pid in killed:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)  # ours (re-parented here): reap it; not ours: nothing to do
    return killed


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(returncode: int) -> int:
    """A shell-style exit status: the code itself, or 128 + signal number."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit code {returncode}"


@dataclass
class Launch:
    """How one rank starts: ``stdin`` None (/dev/null), "inherit" (the launcher's),
    "feed" (a pipe the launcher's stdin is copied to: :class:`.remote.StdinForwarder`) or
    "pipe" (a remote wrapper's control channel, which first gets ``header``)."""

    argv: list[str]
    env: dict[str, str]
    stdin: str | None = None
    header: dict[str, Any] | None = None


class RankProcess:
    """One rank: its process, its exit descriptor, and what happened to it."""

    def __init__(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.returncode: int | None = None
        self.exited_at: float | None = None  # wall clock, when the launcher saw it
        self.signalled = False  # the launcher sent it SIGTERM/SIGKILL
        self.ctl: int | None = None  # control channel of a remote wrapper
        self.feed: int | None = None  # a local rank's stdin pipe ("feed")
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(proc.pid)

    @property
    def running(self) -> bool:
        return self.returncode is None

    def poll(self) -> bool:
        """Reap the process if it has exited; True when it exited just now."""
        if self.returncode is not None:
            return False
        rc = self.proc.poll()
        if rc is None:
            return False
        self.returncode = rc
        self.exited_at = time.time()
        self.close_pidfd()
        return True

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def signal_group(self, signum: int) -> None:
        """Signal the rank's whole process group (it is the group's leader); a remote
        rank gets the signal through its wrapper (SIGKILL: its connection is cut, and
        the wrapper ends the rank)."""
        if self.running:
            self.signalled = True
        if self.ctl is not None and signum != signal.SIGKILL:
            with contextlib.suppress(OSError):
                os.write(self.ctl, f"SIG {signum}\n".encode())
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        if signum == signal.SIGKILL:
            self.close_ctl()

    def close_ctl(self) -> None:
        for fd in (self.ctl, self.feed):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.ctl = self.feed = None


def start_rank(
    rank: int,
    command: Sequence[str],
    env: Mapping[str, str],
    stdin: str | None = None,
    header: Mapping[str, Any] | None = None,
) -> RankProcess:
    """Start one rank with piped stdout/stderr; raises OSError if it cannot start."""
    modes: dict[str | None, int | None] = {
        None: subprocess.DEVNULL,
        "inherit": None,
        "pipe": subprocess.PIPE,
        "feed": subprocess.PIPE,
    }
    proc = subprocess.Popen(
        list(command),
        env=dict(env),
        stdin=modes[stdin],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_preexec(os.getpid(), binding_of(env)),
        close_fds=True,
    )
    rp = RankProcess(rank, proc)
    if proc.stdin is not None and stdin == "feed":
        rp.feed = os.dup(proc.stdin.fileno())
        proc.stdin.close()
    elif proc.stdin is not None:
        rp.ctl = os.dup(proc.stdin.fileno())
        proc.stdin.close()
        line = json.dumps(dict(header or {}), ensure_ascii=True) + "\n"
        data = line.encode("ascii")
        with contextlib.suppress(OSError):  # a wrapper that died is reported by its exit
            while data:
                data = data[os.write(rp.ctl, data) :]
        os.set_blocking(rp.ctl, False)
    return rp


def take_pipes(rp: RankProcess) -> tuple[int, int]:
    """Own the read ends of the rank's stdout/stderr as plain fds (the caller closes them)."""
    fds = []
    for stream in (rp.proc.stdout, rp.proc.stderr):
        assert stream is not None
        fds.append(os.dup(stream.fileno()))
        stream.close()
    return fds[0], fds[1]
