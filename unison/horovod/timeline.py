"""Timeline: a Chrome-trace (Perfetto) JSON file of every tensor's phases.

``HOROVOD_TIMELINE`` / ``UNISON_TIMELINE=path`` (or :func:`unison.torch.start_timeline`)
makes rank 0 record, per tensor, the phases ``NEGOTIATE_<OP>`` (submitted until
every rank had submitted it), ``QUEUE`` (agreed until its execution started),
``MEMCPY_IN_FUSION_BUFFER``, the collective itself (``ALLREDUCE``...) and
``MEMCPY_OUT_FUSION_BUFFER``. Each tensor is one row (a thread named after it).
Events are written as they are recorded, each with one ``pwrite`` that also rewrites
the closing ``]}``: after every event the file is a complete, valid trace, so a rank
that crashes, hangs or is killed (even by SIGKILL) leaves what it recorded until then.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

__all__ = ["Timeline"]

_TAIL = b"\n]}\n"


class Timeline:
    def __init__(self, path: str, pid: int = 0, mark_cycles: bool = False) -> None:
        self.path = path
        self.pid = pid
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        self._tids: dict[str, int] = {}
        self._t0 = time.perf_counter()
        self._closed = False
        head = b'{"displayTimeUnit": "ms", "traceEvents": ['
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.write(self._fd, head + _TAIL)
        self._end = len(head)  # where the next event goes (the tail follows it)
        self._count = 0

    def _write(self, ev: dict[str, Any]) -> None:
        """Append one event (lock held): the event and the tail in one system call."""
        data = (b",\n" if self._count else b"\n") + json.dumps(ev).encode()
        os.pwrite(self._fd, data + _TAIL, self._end)
        self._end += len(data)
        self._count += 1

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 3)

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._write(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": self.pid,
                    "tid": tid,
                    "args": {"name": name},
                }
            )
        return tid

    def span(self, tensor: str, phase: str, start: float, end: float, **args: Any) -> None:
        """A complete event: ``phase`` of ``tensor`` from ``start`` to ``end`` (perf_counter)."""
        with self._lock:
            if self._closed:
                return
            ev: dict[str, Any] = {
                "name": phase,
                "ph": "X",
                "pid": self.pid,
                "tid": self._tid(tensor),
                "ts": self._us(start),
                "dur": max(0.0, self._us(end) - self._us(start)),
            }
            if args:
                ev["args"] = args
            self._write(ev)

    def cycle(self, when: float) -> None:
        if not self.mark_cycles:
            return
        with self._lock:
            if not self._closed:
                self._write(
                    {
                        "name": "CYCLE_START",
                        "ph": "i",
                        "s": "g",
                        "pid": self.pid,
                        "tid": 0,
                        "ts": self._us(when),
                    }
                )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)
