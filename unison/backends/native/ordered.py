"""Ordered execution of one group's collectives.

Operations run one at a time in issue order (their sequence numbers). A blocking
call on an idle group runs inline in the caller's thread (no hand-off latency);
anything else goes to the group's worker thread, started on first use and woken
by a condition variable when work is queued — never paced by sleeping, and not
woken after an inline task unless work was queued meanwhile.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

__all__ = ["OrderedQueue"]


class OrderedQueue:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()  # taken directly on the inline path (fewer calls)
        self._cv = threading.Condition(self._lock)
        self._queue: deque[Callable[[], None]] = deque()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def run(self, task: Callable[[], None], *, inline: bool) -> bool:
        """Run ``task`` in order. Returns True if it ran inline (already finished)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is shut down")
            if inline and not self._busy and not self._queue:
                self._busy = True
            else:
                self._queue.append(task)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name=f"unison-{self.name}", daemon=True
                    )
                    self._thread.start()
                self._cv.notify_all()
                return False
        try:
            task()
        finally:
            with self._lock:
                self._busy = False
                if self._queue:  # only the worker waits, and only for queued work
                    self._cv.notify_all()
        return True

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._busy or not self._queue:
                    if self._closed and not self._queue:
                        return
                    self._cv.wait(1.0)
                task = self._queue.popleft()
                self._busy = True
            try:
                task()
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
