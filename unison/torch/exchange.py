"""One cycle's point-to-point gathering and the execution of its decisions.

Split from :mod:`unison.torch.engine` (module functions on the engine, which holds all
state): :func:`gather` waits for the peers' cycle messages that come point to point,
on the calling thread; :func:`execute` runs the agreed responses, reducing those whose
bytes every rank's message carries inline and handing the rest to the data executor.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import HorovodInternalError
from .handle import Entry
from .inline import deliver, reduce_inline, runs_inline
from .negotiation import RequestKind, Response

if TYPE_CHECKING:
    from .engine import TorchEngine

__all__ = ["SLICE_S", "execute", "gather"]

#: a wait for cycle messages looks for a lost peer this often, asleep after its first
#: slice (one wake-up per slice; a lost peer is reported within it)
SLICE_S = 0.05


def gather(self: TorchEngine, k: int, want: list[int] | None = None) -> dict[int, Any]:
    """Cycle ``k``'s messages from the peers (``want``: only these set ranks)."""
    deadline = time.monotonic() + self.settings.timeout
    need = [r for r in range(self.size) if r != self.me] if want is None else want
    quiet = False
    while True:
        with self._cv:
            got = self._inbox.get(k, {})
            if all(r in got for r in need):
                return dict(self._inbox.pop(k, {}))
            if self._error is not None:
                raise self._error
            gone = [self.ranks[r] for r in self._gone if r not in got and r in need]
            if gone:
                raise HorovodInternalError(
                    f"ranks {sorted(gone)} have shut down while rank "
                    f"{self.ranks[self.me]} still has operations pending: "
                    f"{sorted(self._pending)[:8]}",
                    ranks=gone,
                )
            missing = [self.ranks[r] for r in need if r not in got]
            left = deadline - time.monotonic()
            if left <= 0:
                raise HorovodInternalError(
                    f"negotiation timed out after {self.settings.timeout:g}s; "
                    f"not heard from ranks {missing}",
                    ranks=missing,
                )
            # wait on the posted receive in this thread (no hand-off); taken under
            # the lock: the missing messages have not been delivered, so they land there
            work = self.channel.posted()
        if quiet:  # a slice without a message: is a peer lost? (outside the engine's lock:
            self.channel.check_peers()  # it may take messages that already arrived)
        before = len(got)
        # the first slice drives the transport (a prompt peer answers in microseconds);
        # after a quiet one the peer is slow: sleep, checking for a lost peer each slice
        self.channel.pull(work, min(left, SLICE_S), asleep=quiet)
        quiet = len(self._inbox.get(k, {})) == before


def execute(self: TorchEngine, responses: list[Response], parts: list[dict[str, bytes]]) -> None:
    now = time.perf_counter()
    with self._cv:
        local: list[Entry | None] = []
        for resp in responses:
            join = resp.request.kind is RequestKind.JOIN
            name = "__join__" if join else resp.name
            self._attendance.decided(name, join)
            e = self._pending.pop(name, None)
            if e is not None:
                e.decided = now
            local.append(e)
    rest: list[Response] = []
    rest_local: list[Entry | None] = []
    for resp, e in zip(responses, local, strict=True):
        if self.size > 1 and runs_inline(resp, parts):
            self.counts["inline"] += 1
            start = time.perf_counter()
            self.executor._queue_spans([resp], [e], start)
            flat = reduce_inline(resp, parts, self.size)
            self.executor._span(resp.name, "ALLREDUCE", start, time.perf_counter(), inline=1)
            if e is not None:
                e.handle.finish(e.finish(e, deliver(e, flat)))
        else:
            rest.append(resp)
            rest_local.append(e)
    if rest:
        self.executor.run(rest, rest_local)
    for resp in responses:
        self.cache.put(resp)
