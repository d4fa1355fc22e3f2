"""Reading a launcher's output up to a marker, then the rest with ``communicate()``.

``communicate()`` reads the pipe's file descriptor directly: lines that a buffered
``readline()`` had already pulled into the file object's buffer (those that arrived in
the same chunk as the marker) would never be seen. :func:`read_until` reads with
``os.read`` instead and returns everything it read, for the caller to put in front of
what ``communicate()`` returns.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable

__all__ = ["read_until"]


def read_until(
    proc: subprocess.Popen, done: Callable[[str], bool], timeout: float
) -> tuple[str, bool]:
    """Read ``proc``'s stdout until ``done(text so far)``, end of file or ``timeout``
    seconds; (the text read, whether ``done`` became true)."""
    assert proc.stdout is not None
    head, fd = b"", proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            head += chunk
            text = head.decode(errors="replace")
            if done(text):
                return text, True
    return head.decode(errors="replace"), False
