"""Forward each rank's stdout/stderr lines to the launcher's, prefixed ``[rank] ``.

Lines are forwarded whole, so ranks never interleave mid-line; a partial last line
is forwarded (with a newline added) when its pipe closes. Carriage returns (progress
bars redrawing a line): on a terminal each redraw is forwarded with its one prefix; to
a file or pipe only the last non-blank redraw of each line is kept (one clean line).
The last non-empty stderr line of every rank is kept: it explains a failure when the
rank recorded no reason.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from typing import BinaryIO

__all__ = ["OutputForwarder"]

_CHUNK = 1 << 16
_MAX_LINE = 1 << 20  # a "line" longer than this is forwarded in pieces


class _Stream:
    __slots__ = ("err", "fd", "label", "pending", "rank")

    def __init__(self, rank: int, fd: int, err: bool) -> None:
        self.rank = rank  # the key the supervisor knows the process by
        self.label = rank  # the number in the prefix (an elastic worker's current rank)
        self.fd = fd
        self.err = err
        self.pending = bytearray()


class OutputForwarder:
    """Owns the read ends of the ranks' pipes; driven by the supervisor's selector."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        out: BinaryIO,
        err: BinaryIO,
        *,
        prefix: bool,
        files: str | None = None,
    ) -> None:
        self._files_dir = files
        self._files: dict[tuple[int, bool], BinaryIO] = {}
        self._sel = sel
        self._out = out
        self._err = err
        self._prefix = prefix
        self._open: dict[int, _Stream] = {}
        self._last_err: dict[int, str] = {}
        self._broken: set[int] = set()
        self._tty = {id(out): isatty(out), id(err): isatty(err)}

    def add(self, rank: int, stdout_fd: int, stderr_fd: int) -> None:
        if self._files_dir is not None:  # mpirun's layout: DIR/1/rank.N/stdout, stderr
            where = os.path.join(self._files_dir, "1", f"rank.{rank}")
            os.makedirs(where, exist_ok=True)
            for is_err in (False, True):
                name = os.path.join(where, "stderr" if is_err else "stdout")
                self._files[rank, is_err] = open(name, "wb")
        for fd, is_err in ((stdout_fd, False), (stderr_fd, True)):
            os.set_blocking(fd, False)
            stream = _Stream(rank, fd, is_err)
            self._open[fd] = stream
            self._sel.register(fd, selectors.EVENT_READ, stream)

    def relabel(self, rank: int, label: int) -> None:
        """Prefix the lines of process ``rank`` with ``[label]`` from now on (an elastic
        worker whose rank changed in a new world)."""
        for stream in self._open.values():
            if stream.rank == rank:
                stream.label = label

    def owns(self, data: object) -> bool:
        return isinstance(data, _Stream)

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def last_stderr_line(self, rank: int) -> str | None:
        return self._last_err.get(rank)

    def on_readable(self, data: object) -> None:
        stream = data
        assert isinstance(stream, _Stream)
        try:
            chunk = os.read(stream.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._finish(stream)
            return
        stream.pending += chunk
        tty = self._tty.get(id(self._err if stream.err else self._out), False)
        cr = stream.pending.rfind(b"\r")
        if not tty and len(stream.pending) > _MAX_LINE and cr > stream.pending.rfind(b"\n"):
            del stream.pending[: cr + 1]  # endless redraws: only the latest can matter
        # on a terminal \r ends a line too: progress bars update in place
        cut = stream.pending.rfind(b"\n") + 1
        if tty:
            cut = max(cut, stream.pending.rfind(b"\r") + 1)
        if cut == 0 and len(stream.pending) >= _MAX_LINE:
            cut = len(stream.pending)
        if cut:
            block = bytes(stream.pending[:cut])
            del stream.pending[:cut]
            self._emit(stream, _lines(block, redraws=tty))

    def close_all(self) -> None:
        """Forward what is left and close every pipe (called when the job is over)."""
        for stream in list(self._open.values()):
            self._finish(stream)
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()

    def _finish(self, stream: _Stream) -> None:
        if stream.pending:
            tail = bytes(stream.pending)
            stream.pending.clear()
            self._emit(stream, [tail if tail.endswith(b"\n") else tail + b"\n"])
        self._open.pop(stream.fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(stream.fd)
        with contextlib.suppress(OSError):
            os.close(stream.fd)

    def _emit(self, stream: _Stream, lines: list[bytes]) -> None:
        if stream.err:
            for line in reversed(lines):
                text = line.decode("utf-8", "replace").strip()
                if text:
                    self._last_err[stream.rank] = text
                    break
        copy = self._files.get((stream.rank, stream.err))
        if copy is not None:
            with contextlib.suppress(OSError, ValueError):
                copy.write(b"".join(lines))
                copy.flush()
        sink = self._err if stream.err else self._out
        if id(sink) in self._broken:
            return
        tag = f"[{stream.label}] ".encode() if self._prefix else b""
        if not self._tty.get(id(sink), False):
            lines = [_last_redraw(line) for line in lines]
        try:
            sink.write(b"".join(line if line.strip(b"\r") == b"" else tag + line for line in lines))
            sink.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._broken.add(id(sink))


def isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def _last_redraw(line: bytes) -> bytes:
    """What a terminal finally shows of a line with redraws: ``b"a\\rb\\rc\\n"`` ->
    ``b"c\\n"``; a line cleared by its last redraw (``b"a\\r   \\r"``) -> ``b""``."""
    if b"\r" not in line:
        return line
    end = b"\n" if line.endswith(b"\n") else b""
    body = line[: len(line) - len(end)]
    if body.endswith(b"\r"):  # CRLF, or a redraw that returned to column 0
        body = body[:-1]
    last = body.rsplit(b"\r", 1)[-1]
    return last + end if last.strip() else b""


def _lines(block: bytes, redraws: bool) -> list[bytes]:
    """Split after each ``\\n`` (and, with ``redraws``, after each ``\\r`` not followed
    by one); separators kept."""
    out, start = [], 0
    for i, byte in enumerate(block):
        if byte == 10 or (redraws and byte == 13 and block[i + 1 : i + 2] != b"\n"):
            out.append(block[start : i + 1])
            start = i + 1
    if start < len(block):
        out.append(block[start:])
    return out
