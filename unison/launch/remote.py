"""The remote side of a rank on another host: ``python -m unison.launch.remote``.

The launcher starts this wrapper through the remote shell (``ssh host '<python> -m
unison.launch.remote'``) with nothing job-specific on its command line. Its stdin is
the launcher's control channel:

* the first line is a JSON header: ``argv`` (the rank's command, each word as given),
  ``env`` (variables to set: the forwarded environment and the job's, the secret
  included: never on a command line), ``cwd`` (the launcher's working directory),
  ``host`` (for messages) and ``store`` (address, port) to check before starting;
* then lines ``SIG <n>``: send signal n to the rank's process group;
* end of file (the launcher or its ssh connection is gone): the rank's group gets
  SIGTERM, then SIGKILL after :data:`GRACE` seconds, and the wrapper exits.

The rank runs in its own session (process group) and dies with the wrapper
(``PR_SET_PDEATHSIG``). The wrapper exits with the rank's status (re-raising the
rank's fatal signal, so the launcher reports "killed by SIGKILL" as for a local rank).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

__all__ = ["GRACE", "main"]

GRACE = 1.0
STORE_CHECK_SECONDS = 10.0
_MAX_HEADER = 64 << 20


def _say(host: str, text: str) -> None:
    sys.stderr.write(f"unison run: host {host}: {text}\n")
    sys.stderr.flush()


def _read_header(fd: int) -> tuple[dict[str, object], bytes]:
    buf = bytearray()
    while b"\n" not in buf:
        chunk = os.read(fd, 1 << 16)
        if not chunk or len(buf) > _MAX_HEADER:
            raise SystemExit(255)  # the launcher went away before it said anything
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    header = json.loads(line.decode("utf-8", "surrogatepass"))
    assert isinstance(header, dict)
    return header, rest


def _store_reachable(host: str, store: list[object], timeout: float) -> bool:
    addr, port = str(store[0]), int(str(store[1]))
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError as exc:
        _say(
            host,
            f"cannot reach the launcher's rendezvous store at {addr}:{port} ({exc}); "
            "check that this host can connect to the launcher (firewall, routes) or "
            "give --store-addr / --network-interface",
        )
        return False


def _exit_like(returncode: int) -> None:
    if returncode < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
    raise SystemExit(returncode if returncode >= 0 else 128 - returncode)


def main() -> None:
    from .supervise import _preexec

    stdin = sys.stdin.fileno()
    header, rest = _read_header(stdin)
    host = str(header.get("host", "?"))
    argv = [str(a) for a in header["argv"]]  # type: ignore[attr-defined]
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in header["env"].items()})  # type: ignore[attr-defined]
    cwd = str(header.get("cwd") or "")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            _say(host, f"cannot change to the launch directory {cwd!r} ({exc.strerror})")
            raise SystemExit(1) from None
        env["PWD"] = cwd
    store = header.get("store")
    timeout = float(str(header.get("start_timeout") or STORE_CHECK_SECONDS))
    if isinstance(store, list) and not _store_reachable(host, store, timeout):
        raise SystemExit(1)
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_preexec(os.getpid()),
        )
    except OSError as exc:
        what = "command not found" if isinstance(exc, FileNotFoundError) else exc.strerror
        _say(host, f"cannot start {argv[0]!r}: {what}")
        raise SystemExit(127 if isinstance(exc, FileNotFoundError) else 126) from None

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sel = selectors.DefaultSelector()
    os.set_blocking(stdin, False)
    sel.register(stdin, selectors.EVENT_READ, "ctl")
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    pending = bytearray(rest)
    hung_up_at: float | None = None
    while proc.poll() is None:
        wait = None if hung_up_at is None else max(0.0, hung_up_at + GRACE - time.monotonic())
        for key, _ in sel.select(wait):
            if key.data != "ctl":
                continue
            try:
                chunk = os.read(stdin, 4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:  # the launcher is gone: so is the rank
                sel.unregister(stdin)
                forward(signal.SIGTERM, None)
                hung_up_at = time.monotonic()
                continue
            pending += chunk
        while b"\n" in pending:
            line, _, tail = bytes(pending).partition(b"\n")
            pending = bytearray(tail)
            word, _, num = line.decode("ascii", "replace").partition(" ")
            if word == "SIG" and num.strip().isdigit():
                forward(int(num), None)
        if hung_up_at is not None and time.monotonic() >= hung_up_at + GRACE:
            forward(signal.SIGKILL, None)
            proc.wait()
    forward(signal.SIGKILL, None)  # nothing the rank started outlives it
    _exit_like(proc.returncode)


if __name__ == "__main__":
    main()
