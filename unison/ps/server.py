"""The server process: one receiving thread per worker, one thread that decides and answers.

Each receiving thread keeps a request receive posted for its worker (there is no
any-source receive), reads the header, the metadata and the arrays it announces,
and queues the whole request. The serving thread (the caller of :meth:`Server.serve`)
hands requests to :class:`~unison.ps.state.ServerState` in arrival order — so the
pushes of one worker are applied in the order it sent them — and sends the replies.
It sleeps on the queue, waking for the next request or the next parked deadline.

A worker that drops its connection without saying goodbye, or that sends nothing
for the job's timeout, is reported as lost; every parked and later request of the
others then fails with an error naming it, and the server ends once every worker
has left.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import from_numpy
from ..comm.group import Group
from ..comm.work import Work
from ..errors import (
    CollectiveTimeoutError,
    CommunicationError,
    InvalidArgumentError,
    MismatchError,
    PeerLostError,
)
from ..log import get_logger
from ..world import current
from .consistency import Consistency
from .join import JoinWatcher, publish_job
from .partition import DEFAULT_SPLIT_BYTES
from .state import Reply, ServerState, WorkerRequest
from .wire import (
    HEADER,
    TAG_REPLY,
    TAG_REQUEST,
    PsOp,
    pack_header,
    pack_meta,
    unpack_header,
    unpack_meta,
)

__all__ = ["Server", "ServerSummary"]

log = get_logger("ps")


@dataclass(frozen=True)
class ServerSummary:
    """What a server did, returned by :func:`unison.ps.serve` when the job ends."""

    rank: int
    index: int
    keys: int
    pushes: int
    pulls: int
    parked: int
    bytes_in: int
    bytes_out: int
    failure: str | None


@dataclass
class _Lost:
    worker: int
    reason: str


def _array_for(spec: Any) -> np.ndarray | None:
    """An empty array for an announced (dtype, count), or None if the spec is unusable."""
    try:
        dtype = np.dtype(str(spec[0]))
        count = int(spec[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    if from_numpy(dtype) is None or count < 0:
        return None
    return np.empty(count, dtype)


class Server:
    """Serves the workers of one job; ``workers`` are their global ranks in ``comm`` (worker
    i is the i-th); in an elastic job (``UNISON_PS_ELASTIC``) more join while it serves."""

    def __init__(
        self,
        comm: Group,
        index: int,
        workers: list[int],
        policy: Consistency,
        timeout: float,
        *,
        servers: int = 1,
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        runtime: Any = None,
    ) -> None:
        self.comm = comm
        self.runtime = runtime  # the process's world (elastic: joining workers reach it)
        self.rank = comm.global_rank
        self.timeout = timeout
        self.servers = servers
        self.split_bytes = split_bytes
        self.elastic = comm.config.ps_elastic
        self.elastic_timeout = comm.config.elastic_timeout
        self.state = ServerState(
            index,
            self.rank,
            range(len(workers)),
            policy,
            park_timeout=0.8 * timeout,
            elastic=self.elastic,
        )
        #: (worker id, incarnation) -> (the group that reaches it, its rank there); a
        #: worker that joins later is incarnation ``ticket`` of its id, the first ones 0
        self.links: dict[tuple[int, int], tuple[Group, int]] = {
            (w, 0): (comm, rank) for w, rank in enumerate(workers)
        }
        self.current: dict[int, int] = dict.fromkeys(range(len(workers)), 0)
        self.inbox: queue.Queue[tuple[int, WorkerRequest | _Lost]] = queue.Queue()
        self.sends: deque[Work] = deque()
        self.watcher: JoinWatcher | None = None
        self.threads: list[threading.Thread] = []

    # --- receiving (one thread per worker) -------------------------------------------------
    def _recv(self, buf: np.ndarray, link: tuple[Group, int]) -> None:
        link[0].irecv(buf, link[1], TAG_REQUEST).wait()

    def _read(self, worker: int, link: tuple[Group, int]) -> WorkerRequest:
        hdr = np.empty(HEADER.size, np.uint8)
        try:
            self._recv(hdr, link)
        except CollectiveTimeoutError:
            raise CollectiveTimeoutError(
                f"worker rank {worker} sent nothing for {self.timeout:g} s (UNISON_TIMEOUT)",
                ranks=(worker,),
            ) from None
        op, count, req_id, clock, meta_len = unpack_header(hdr)
        req = WorkerRequest(worker, op, req_id, clock)
        if meta_len:
            raw = np.empty(meta_len, np.uint8)
            self._recv(raw, link)
            try:
                req.meta = unpack_meta(raw)
            except (ValueError, InvalidArgumentError) as exc:
                req.error = InvalidArgumentError(f"unreadable request metadata: {exc}")
        specs = req.meta.get("arrays", []) if isinstance(req.meta.get("arrays"), list) else []
        for i in range(count):
            arr = _array_for(specs[i]) if i < len(specs) else None
            try:
                # an unusable spec is received as nothing: the transport reports the
                # mismatch and discards the message, so the stream stays in step
                self._recv(arr if arr is not None else np.empty(0, np.uint8), link)
            except MismatchError as exc:
                if req.error is None:
                    req.error = InvalidArgumentError(f"array {i} of the request: {exc}")
                continue
            if arr is None:
                req.error = req.error or InvalidArgumentError(
                    f"array {i}: bad spec {specs[i : i + 1]}"
                )
            else:
                req.arrays.append(arr)
        return req

    def _receive_loop(self, worker: int, gen: int) -> None:
        link = self.links[(worker, gen)]
        while True:
            try:
                req = self._read(worker, link)
            except CommunicationError as exc:
                head, sep, cause = str(exc).partition("): ")  # "recv from rank 1 (tag N): "
                why = cause if sep and "(tag " in head else str(exc)
                self.inbox.put((gen, _Lost(worker, why)))
                return
            except Exception as exc:  # never leave the serving thread waiting
                self.inbox.put((gen, _Lost(worker, f"receiving failed: {exc!r}")))
                return
            self.inbox.put((gen, req))
            if req.op == PsOp.BYE:
                return

    def _listen(self, worker: int, gen: int) -> None:
        t = threading.Thread(
            target=self._receive_loop,
            args=(worker, gen),
            name=f"unison-ps-recv-{worker}.{gen}",
            daemon=True,
        )
        self.threads.append(t)
        t.start()

    def _joined(self, worker: int, ticket: int, world: Any) -> None:
        """The join watcher's thread: worker ``worker`` connected over ``world`` (it is
        rank ``servers`` there); its first request is its JOIN."""
        self.links[(worker, ticket)] = (world.world, self.servers)
        self._listen(worker, ticket)

    def _admit(self, gen: int, item: WorkerRequest | _Lost) -> bool:
        """Whether an item comes from the worker's current incarnation (a JOIN makes its
        incarnation current); items of a replaced incarnation are dropped."""
        w = item.worker
        if isinstance(item, WorkerRequest) and item.op == PsOp.JOIN:
            if gen < self.current.get(w, -1):
                return False
            self.current[w] = gen
            return True
        return self.current.get(w) == gen

    # --- sending ---------------------------------------------------------------------------
    def _send(self, reply: Reply) -> None:
        meta = pack_meta(reply.meta)
        hdr = pack_header(reply.status, len(reply.arrays), reply.req_id, 0, meta.size)
        parts = [hdr, meta] if meta.size else [hdr]
        group, peer = self.links[(reply.worker, self.current[reply.worker])]
        for part in [*parts, *reply.arrays]:
            self.sends.append(group.isend(part, peer, TAG_REPLY))
        while self.sends and self.sends[0].is_completed():
            self.sends.popleft()

    # --- the serving loop ------------------------------------------------------------------
    def serve(self) -> ServerSummary:
        st = self.state
        for worker in list(self.current):
            self._listen(worker, 0)
        if self.elastic:
            rt = self.runtime if self.runtime is not None else current()
            publish_job(rt, self.servers, st.policy, self.split_bytes)
            self.watcher = JoinWatcher(rt, st.index, self.servers, self._joined)
            self.watcher.start()
        alone_since: float | None = None
        try:
            while not st.finished():
                deadline = st.next_deadline()
                if st.waiting_for_a_worker():  # elastic, every worker lost: wait for one
                    alone_since = alone_since or time.monotonic()
                    end = alone_since + self.elastic_timeout
                    if time.monotonic() >= end:
                        st.failure = PeerLostError(
                            f"server rank {self.rank}: every worker was lost and none joined "
                            f"within {self.elastic_timeout:g} s (UNISON_ELASTIC_TIMEOUT)"
                        )
                        break
                    deadline = end if deadline is None else min(deadline, end)
                else:
                    alone_since = None
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    gen, item = self.inbox.get(timeout=wait)
                except queue.Empty:
                    replies = st.expire()
                else:
                    if not self._admit(gen, item):
                        continue
                    if isinstance(item, _Lost):
                        if not st.elastic:  # elastic: st.lost says it, at INFO
                            log.error("server rank %d: %s", self.rank, item.reason)
                        replies = st.lost(item.worker, item.reason)
                    else:
                        replies = st.handle(item)
                for r in replies:
                    self._send(r)
            end = time.monotonic() + min(10.0, self.timeout)
            for w in self.sends:
                try:
                    w.wait(max(0.0, end - time.monotonic()))
                except Exception:
                    pass
        finally:
            if self.watcher is not None:  # after the last replies: it closes their worlds
                self.watcher.close()
        for t in self.threads:
            t.join(timeout=1.0)
        s = st.stats
        return ServerSummary(
            self.rank,
            st.index,
            len(st.shards),
            s["push"],
            s["pull"],
            s["parked"],
            s["bytes_in"],
            s["bytes_out"],
            None if st.failure is None else str(st.failure),
        )
