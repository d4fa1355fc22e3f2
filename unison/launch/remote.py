"""The remote side of a rank on another host: ``python -m unison.launch.remote``.

The launcher starts this wrapper through the remote shell (``ssh host '<python> -m
unison.launch.remote'``) with nothing job-specific on its command line. Its stdin is
the launcher's control channel:

* the first line is a JSON header: ``argv`` (the rank's command, each word as given),
  ``env`` (variables to set: the forwarded environment and the job's, the secret
  included: never on a command line), ``cwd`` (the launcher's working directory),
  ``host`` (for messages) and ``store`` (address, port) to check before starting;
* then lines ``SIG <n>``: send signal n to the rank's process group, and (when the
  header says ``"stdin": true``) frames ``IN <n>`` followed by n bytes of the launcher's
  stdin for the rank's stdin, ``IN 0`` closing it (the rank otherwise reads /dev/null);
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
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["FRAME", "GRACE", "StdinForwarder", "main"]

GRACE = 1.0
STORE_CHECK_SECONDS = 10.0
_MAX_HEADER = 64 << 20
FRAME = 4000  # data bytes per ``IN`` frame: a whole frame fits one atomic pipe write
_HIGH_WATER = 16 << 20  # stop reading the launcher's stdin while a rank is this far behind


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


class _Target:
    """One destination of :class:`StdinForwarder`: bytes queued, written when it can take them."""

    def __init__(self, fd: int, framed: bool) -> None:
        self.fd = fd
        self.framed = framed
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.eof = False
        os.set_blocking(fd, False)

    def push(self, data: bytes) -> None:
        if self.fd < 0:
            return
        if not self.framed:
            self.queue.append(data)
            self.queued += len(data)
            return
        for i in range(0, len(data), FRAME):
            part = data[i : i + FRAME]
            self.queue.append(b"IN %d\n" % len(part) + part)
            self.queued += len(part)

    def finish(self) -> None:
        self.eof = True
        if self.framed:
            self.queue.append(b"IN 0\n")

    def flush(self) -> None:
        while self.queue and self.fd >= 0:
            head = self.queue[0]
            try:
                n = os.write(self.fd, head)
            except BlockingIOError:
                return
            except OSError:  # the rank (or its wrapper) is gone: nothing more to give it
                self.close()
                return
            self.queued -= n
            if n < len(head):  # raw targets only: a frame fits one atomic pipe write
                self.queue[0] = head[n:]
                return
            self.queue.popleft()
        if self.eof and not self.queue:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
            self.queue.clear()


def _background_tty(fd: int) -> bool:
    """``fd`` is a terminal this process is not in the foreground of (``unison run … &``)."""
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:
        return False


class StdinForwarder:
    """The launcher's side of ``--stdin`` when the launcher cannot simply hand its stdin
    to one local rank: a thread copies ``src`` (the launcher's stdin) to every target,
    ``(fd, framed)``: a remote wrapper's control pipe (``IN`` frames, each written whole,
    so they never interleave with the launcher's ``SIG`` lines) or a local rank's stdin
    pipe (the bytes as they are). Each target gets the whole stream; at end of file a
    framed target gets ``IN 0``, a raw one is closed. The forwarder writes to its own
    duplicates of the descriptors and closes them when done or closed."""

    def __init__(self, targets: Sequence[tuple[int, bool]], src: int = 0) -> None:
        self._src = src
        self._targets = [_Target(os.dup(fd), framed) for fd, framed in targets]
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="unison-stdin", daemon=True)

    def start(self) -> StdinForwarder:
        self._thread.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if not self._thread.is_alive():
            for fd in (self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _run(self) -> None:
        reading = True
        if _background_tty(self._src):  # reading it would stop the launcher (SIGTTIN)
            reading = False
            for t in self._targets:
                t.finish()
                t.flush()
        poll = select.poll()
        try:
            while True:
                live = [t for t in self._targets if t.fd >= 0]
                if not live:
                    return
                watched = {self._stop_r: None}
                if reading and all(t.queued < _HIGH_WATER for t in live):
                    watched[self._src] = None
                for fd in watched:
                    poll.register(fd, select.POLLIN)
                writers = {t.fd: t for t in live if t.queue}
                for fd in writers:
                    poll.register(fd, select.POLLOUT)
                events = poll.poll()
                for fd in [*watched, *writers]:
                    poll.unregister(fd)
                for fd, _ in events:
                    if fd == self._stop_r:
                        return
                    if fd == self._src:
                        reading = self._read(live)
                    elif fd in writers:
                        writers[fd].flush()
        finally:
            for t in self._targets:
                t.close()

    def _read(self, live: Sequence[_Target]) -> bool:
        try:
            chunk = os.read(self._src, 1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        for t in live:
            if chunk:
                t.push(chunk)
            else:
                t.finish()
            t.flush()
        return bool(chunk)


class _RankInput:
    """The rank's stdin on the remote host: what ``IN`` frames bring, written as the rank
    reads it (never blocking the wrapper); closed at ``IN 0`` or when the launcher is gone."""

    def __init__(self, fd: int, sel: selectors.BaseSelector) -> None:
        self.fd = fd
        self.sel = sel
        self.buf = bytearray()
        self.eof = False
        self.watching = False
        os.set_blocking(fd, False)

    def feed(self, data: bytes) -> None:
        if data:
            self.buf += data
        else:
            self.eof = True
        self.flush()

    def flush(self) -> None:
        while self.buf and self.fd >= 0:
            try:
                n = os.write(self.fd, self.buf)
            except BlockingIOError:
                break
            except OSError:  # the rank closed its stdin: drop the rest
                self.close()
                return
            del self.buf[:n]
        if self.fd < 0:
            return
        if self.eof and not self.buf:
            self.close()
            return
        want = bool(self.buf)
        if want != self.watching:
            if want:
                self.sel.register(self.fd, selectors.EVENT_WRITE, "in")
            else:
                self.sel.unregister(self.fd)
            self.watching = want

    def close(self) -> None:
        if self.fd >= 0:
            if self.watching:
                self.sel.unregister(self.fd)
                self.watching = False
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
            self.buf.clear()


def _take_lines(
    pending: bytearray, rank_in: _RankInput | None, forward: Callable[[int, object], None]
) -> None:
    """Act on the complete control lines and ``IN`` frames at the head of ``pending``."""
    while True:
        nl = pending.find(b"\n")
        if nl < 0:
            return
        word, _, num = bytes(pending[:nl]).decode("ascii", "replace").partition(" ")
        num = num.strip()
        if word == "IN" and num.isdigit():
            end = nl + 1 + int(num)
            if len(pending) < end:
                return  # the rest of the frame has not arrived yet
            if rank_in is not None:
                rank_in.feed(bytes(pending[nl + 1 : end]))
            del pending[:end]
            continue
        del pending[: nl + 1]
        if word == "SIG" and num.isdigit():
            forward(int(num), None)


def main() -> None:
    from .supervise import _preexec

    stdin = sys.stdin.fileno()
    header, rest = _read_header(stdin)
    host = str(header.get("host", "?"))
    argv = [str(a) for a in header["argv"]]  # type: ignore[attr-defined]
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in header["env"].items()})  # type: ignore[attr-defined]
    share = int(str(header.get("share_cores") or 0))
    # this host's cores, divided among its ranks: the binding (rankenv.cpu_share), decided
    # before the thread counts are set (the user's own count keeps the rank unbound)
    from .. import config as C
    from .rankenv import binding_environment, binding_of, thread_environment, usable_cpus

    cpus = usable_cpus()
    for name in (C.ENV_CPUS, C.ENV_HOST_CORES):
        env.pop(name, None)
    local_rank = int(env.get(C.ENV_LOCAL_RANK) or 0)
    local_size = int(env.get(C.ENV_LOCAL_SIZE) or 1)
    env.update(binding_environment(env, local_rank, local_size, cpus))
    if share:
        env.update(thread_environment(env, share, len(cpus)))
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
    want_stdin = bool(header.get("stdin"))
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE if want_stdin else subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_preexec(os.getpid(), binding_of(env)),
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
    rank_in: _RankInput | None = None
    if proc.stdin is not None:
        rank_in = _RankInput(os.dup(proc.stdin.fileno()), sel)
        proc.stdin.close()
    os.set_blocking(stdin, False)
    sel.register(stdin, selectors.EVENT_READ, "ctl")
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    pending = bytearray(rest)
    _take_lines(pending, rank_in, forward)
    hung_up_at: float | None = None
    while proc.poll() is None:
        wait = None if hung_up_at is None else max(0.0, hung_up_at + GRACE - time.monotonic())
        for key, _ in sel.select(wait):
            if key.data == "in" and rank_in is not None:
                rank_in.flush()
            if key.data != "ctl":
                continue
            try:
                chunk = os.read(stdin, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:  # the launcher is gone: so is the rank
                sel.unregister(stdin)
                if rank_in is not None:
                    rank_in.close()
                forward(signal.SIGTERM, None)
                hung_up_at = time.monotonic()
                continue
            pending += chunk
            _take_lines(pending, rank_in, forward)
        if hung_up_at is not None and time.monotonic() >= hung_up_at + GRACE:
            forward(signal.SIGKILL, None)
            proc.wait()
    forward(signal.SIGKILL, None)  # nothing the rank started outlives it
    _exit_like(proc.returncode)


if __name__ == "__main__":
    main()
