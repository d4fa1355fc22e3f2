"""Timeline: a Chrome-trace (Perfetto) JSON file of every tensor's phases.

``HOROVOD_TIMELINE`` / ``UNISON_TIMELINE=path`` (or :func:`unison.torch.start_timeline`)
makes rank 0 record, per tensor, the phases ``NEGOTIATE_<OP>`` (submitted until
every rank had submitted it), ``QUEUE`` (agreed until its execution started),
``MEMCPY_IN_FUSION_BUFFER``, the collective itself (``ALLREDUCE``...) and
``MEMCPY_OUT_FUSION_BUFFER``. Each tensor is one row (a thread named after it).
The file is valid JSON once :meth:`Timeline.close` ran (at shutdown).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

__all__ = ["Timeline"]


class Timeline:
    def __init__(self, path: str, pid: int = 0, mark_cycles: bool = False) -> None:
        self.path = path
        self.pid = pid
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._tids: dict[str, int] = {}
        self._t0 = time.perf_counter()
        self._closed = False

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 3)

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._events.append(
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
            self._events.append(ev)

    def cycle(self, when: float) -> None:
        if not self.mark_cycles:
            return
        with self._lock:
            if not self._closed:
                self._events.append(
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
            events = self._events
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
        os.replace(tmp, self.path)
