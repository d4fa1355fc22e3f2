"""What one server holds and decides, with no I/O: shards, clocks, held pushes, parked pulls.

:class:`ServerState` takes decoded requests and returns the replies to send. The
server process (:mod:`unison.ps.server`) only moves bytes; everything a test may
want to check in one process (consistency gating, held pushes, errors that leave
the data intact) happens here.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CollectiveTimeoutError, CommunicationError, InvalidArgumentError, PeerLostError
from ..log import get_logger
from . import checkpoint
from .consistency import DONE, Consistency
from .rules import Assign, Rule
from .wire import PsOp, PsStatus, encode_error

log = get_logger("ps")

__all__ = ["Reply", "WorkerRequest", "ServerState"]

PieceKey = tuple[str, int]


@dataclass
class WorkerRequest:
    """A decoded request from worker rank ``worker``."""

    worker: int
    op: int
    req_id: int
    clock: int
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None  # the request could not even be received whole


@dataclass
class Reply:
    worker: int
    req_id: int
    status: PsStatus
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)


@dataclass
class _KeyMeta:
    shape: list[int]
    dtype: str
    owner: int
    committed: bool = False


@dataclass
class _Parked:
    req: WorkerRequest
    deadline: float
    ready: Callable[[], bool]
    serve: Callable[[], Reply]
    what: str


def _bad(text: str) -> InvalidArgumentError:
    return InvalidArgumentError(text)


class ServerState:
    def __init__(
        self,
        index: int,
        rank: int,
        workers: Sequence[int],
        policy: Consistency,
        park_timeout: float,
        now: Callable[[], float] = time.monotonic,
        elastic: bool = False,
    ) -> None:
        self.elastic = elastic  # a lost worker leaves the clocks instead of failing the job
        self.index = index
        self.rank = rank
        #: every worker id that has been in the job (elastic jobs add the ones that join)
        self.workers = list(workers)
        self.policy = policy
        self.park_timeout = park_timeout
        self.now = now
        self.clocks: dict[int, int] = {w: 0 for w in self.workers}
        self.barriers: dict[int, int] = {w: 0 for w in self.workers}
        self.gone: set[int] = set()  # left with BYE, or lost
        self.left_cleanly = 0  # workers that said goodbye without an error
        self.shards: dict[PieceKey, np.ndarray] = {}
        self.info: dict[PieceKey, dict[str, Any]] = {}  # shape, dtype, start, stop
        self.metas: dict[str, _KeyMeta] = {}  # keys whose home is this server
        self.held: dict[int, dict[PieceKey, dict[int, np.ndarray]]] = {}  # clock -> piece -> worker
        self.parked: list[_Parked] = []
        self.rule: Rule = Assign()
        self.rule_state: dict[PieceKey, dict[str, np.ndarray]] = {}
        self.failure: CommunicationError | None = None
        self.stats = {"push": 0, "pull": 0, "parked": 0, "bytes_in": 0, "bytes_out": 0}

    # --- clocks ---------------------------------------------------------------------------
    def slowest(self) -> int:
        live = [c for w, c in self.clocks.items() if w not in self.gone]
        return min(live) if live else DONE

    def finished(self) -> bool:
        """Every worker has left; in an elastic job, at least one of them in order (while
        all were lost, a replacement may still join)."""
        done = len(self.gone) == len(self.workers)
        return done and (not self.elastic or self.left_cleanly > 0 or self.failure is not None)

    def waiting_for_a_worker(self) -> bool:
        """Elastic: every worker was lost; the job lives on only if one joins."""
        return len(self.gone) == len(self.workers) and not self.finished()

    def blockers(self, clock: int) -> list[int]:
        """Live workers whose clock keeps a pull at ``clock`` waiting."""
        return [
            w
            for w, c in sorted(self.clocks.items())
            if w not in self.gone and not self.policy.pull_ready(clock, c)
        ]

    # --- entry points ---------------------------------------------------------------------
    def handle(self, req: WorkerRequest) -> list[Reply]:
        out: list[Reply] = []
        if req.op == PsOp.BYE:
            return self._bye(req)
        if req.op == PsOp.JOIN:
            return self._join(req)
        if req.error is not None:
            return [self._error(req, req.error)]
        if self.failure is not None:
            return [] if req.op == PsOp.CLOCK else [self._error(req, self.failure)]
        try:
            if req.op == PsOp.CLOCK:
                self.clocks[req.worker] = max(self.clocks[req.worker], req.clock)
            elif req.op == PsOp.CLAIM:
                out.extend(self._claim(req))
            elif req.op == PsOp.INIT:
                out.append(self._init(req))
            elif req.op == PsOp.COMMIT:
                out.append(self._commit(req))
            elif req.op == PsOp.PUSH:
                out.append(self._push(req))
            elif req.op == PsOp.PULL:
                out.extend(self._pull(req))
            elif req.op == PsOp.RULE:
                out.append(self._set_rule(req))
            elif req.op == PsOp.SAVE:
                out.append(self._save(req))
            elif req.op == PsOp.BARRIER:
                out.extend(self._barrier(req))
            else:
                raise _bad(f"unknown request op {req.op}")
        except InvalidArgumentError as exc:
            out.append(self._error(req, exc))
        out.extend(self._progress())
        return out

    def lost(self, worker: int, reason: str) -> list[Reply]:
        """Worker ``worker`` died or went silent: the job cannot go on (elastic: it goes
        on without that worker)."""
        if worker in self.gone:
            return []
        self.gone.add(worker)
        if self.elastic:  # its clock leaves the SSP/BSP computation; the others go on
            log.info("worker rank %d left the job (%s); going on without it", worker, reason)
            self._forget(worker)
            return self._progress()
        if self.failure is None:
            self.failure = PeerLostError(
                f"worker rank {worker} was lost ({reason}); the job cannot go on",
                ranks=(worker,),
            )
        return self._progress()

    def expire(self) -> list[Reply]:
        now = self.now()
        out, keep = [], []
        for p in self.parked:
            if p.deadline > now:
                keep.append(p)
                continue
            late = self.blockers(p.req.clock)
            who = ", ".join(f"rank {w} at clock {self.clocks[w]}" for w in late) or "nobody"
            err = CollectiveTimeoutError(
                f"{p.what} at clock {p.req.clock} waited {self.park_timeout:g} s; "
                f"held back by {who} under {self.policy!r}",
                ranks=late,
            )
            out.append(self._error(p.req, err))
        self.parked = keep
        return out

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self.parked), default=None)

    # --- requests -------------------------------------------------------------------------
    def _error(self, req: WorkerRequest, exc: BaseException) -> Reply:
        return Reply(req.worker, req.req_id, PsStatus.ERROR, encode_error(exc))

    def _ok(self, req: WorkerRequest, meta: dict[str, Any] | None = None) -> Reply:
        return Reply(req.worker, req.req_id, PsStatus.OK, meta or {})

    def _bye(self, req: WorkerRequest) -> list[Reply]:
        out = [self._ok(req)]
        if req.meta.get("failed"):
            why = str(req.meta.get("reason", "unknown error"))
            out.extend(self.lost(req.worker, f"it failed: {why}"))
        else:
            if req.worker not in self.gone:
                self.left_cleanly += 1
            self.gone.add(req.worker)
            out.extend(self._progress())
        return out

    # --- elastic: a lost worker's unfinished step, a worker that joins ---------------------
    def _forget(self, worker: int) -> None:
        """Drop what a lost worker left unfinished: its parked requests (nobody will read
        the answers) and its pushes, not yet applied, of the step it never finished (made
        at its last clock or later): a replacement redoes that step."""
        self.parked = [p for p in self.parked if p.req.worker != worker]
        last = self.clocks.get(worker, 0)
        for clock, pieces in self.held.items():
            if clock >= last:
                for parts in pieces.values():
                    parts.pop(worker, None)
        for clock in [c for c, pieces in self.held.items() if not any(pieces.values())]:
            del self.held[clock]

    def start_clock(self, worker: int) -> int:
        """The clock a worker joining now starts at: the slowest live worker's clock, or its
        predecessor's (same id) if that is later; with no worker live, the furthest clock."""
        known = [c for w, c in self.clocks.items() if w != worker]
        live = [c for w, c in self.clocks.items() if w not in self.gone and w != worker]
        base = min(live) if live else max(known, default=0)
        return max(base, self.clocks.get(worker, 0))

    def _join(self, req: WorkerRequest) -> list[Reply]:
        """Worker ``req.worker`` joins a running elastic job (a replacement keeps the id of
        the worker it replaces). It is held at the clock it may start at until it announces
        the clock it starts at (the largest any server offered), so no server applies a
        clock it may still push to."""
        if not self.elastic:
            return [self._error(req, _bad("join: this parameter-server job is not elastic"))]
        out: list[Reply] = []
        w = req.worker
        if w in self.clocks and w not in self.gone:  # its predecessor's loss is still in flight
            out.extend(self.lost(w, "replaced by a worker with the same id"))
        start = self.start_clock(w)
        if w not in self.workers:
            self.workers.append(w)
        self.gone.discard(w)
        self.clocks[w] = start
        # it runs the script from the top: its k-th barrier() is everyone's k-th, so the
        # barriers the others have passed return at once and one they wait in waits for it
        self.barriers[w] = 0
        log.info("worker %d joined the job at clock %d", w, start)
        out.append(self._ok(req, {"clock": start, "workers": len(self.workers)}))
        out.extend(self._progress())
        return out

    def _claim(self, req: WorkerRequest) -> list[Reply]:
        keys = req.meta.get("keys", [])
        for k in keys:
            name = str(k["k"])
            if name not in self.metas and k.get("shape") is None:
                raise _bad(f"key {name!r} is unknown: it was never initialised with init_params")
        for k in keys:
            name = str(k["k"])
            if name not in self.metas and k.get("shape") is not None:
                shape, dtype = [int(s) for s in k["shape"]], str(k["dtype"])
                self.metas[name] = _KeyMeta(shape, dtype, req.worker)

        def ready() -> bool:
            return all(
                self.metas[str(k["k"])].committed or self.metas[str(k["k"])].owner == req.worker
                for k in keys
            )

        def serve() -> Reply:
            found = []
            for k in keys:
                m = self.metas[str(k["k"])]
                won = m.owner == req.worker and not m.committed
                found.append({"k": k["k"], "shape": m.shape, "dtype": m.dtype, "won": won})
            return self._ok(req, {"keys": found})

        return self._park_or_serve(req, ready, serve, "init_params/lookup")

    def _init(self, req: WorkerRequest) -> Reply:
        pieces = req.meta.get("pieces", [])
        if len(pieces) != len(req.arrays):
            raise _bad("init: metadata and arrays disagree")
        for spec in pieces:
            if (str(spec["k"]), int(spec["p"])) in self.shards:
                raise _bad(f"init: key {spec['k']!r} piece {spec['p']} is already initialised")
        for spec, arr in zip(pieces, req.arrays, strict=True):
            pk = (str(spec["k"]), int(spec["p"]))
            self.shards[pk] = arr
            self.info[pk] = {
                "shape": [int(s) for s in spec["shape"]],
                "dtype": arr.dtype.str,
                "start": int(spec["start"]),
                "stop": int(spec["stop"]),
            }
        return self._ok(req)

    def _commit(self, req: WorkerRequest) -> Reply:
        for name in req.meta.get("keys", []):
            m = self.metas.get(str(name))
            if m is None or m.owner != req.worker:
                raise _bad(f"commit: key {name!r} was not claimed by worker rank {req.worker}")
            m.committed = True
        return self._ok(req)

    def _pieces(self, req: WorkerRequest, what: str) -> list[PieceKey]:
        out = []
        for spec in req.meta.get("pieces", []):
            pk = (str(spec[0]), int(spec[1]))
            if pk not in self.shards:
                raise _bad(
                    f"{what}: key {pk[0]!r} (piece {pk[1]}) is not on this server: "
                    "it was never initialised with init_params"
                )
            out.append(pk)
        return out

    def _push(self, req: WorkerRequest) -> Reply:
        pks = self._pieces(req, "push")
        if len(pks) != len(req.arrays):
            raise _bad("push: metadata and arrays disagree")
        for pk, arr in zip(pks, req.arrays, strict=True):
            stored = self.shards[pk]
            info = self.info[pk]
            if arr.dtype != stored.dtype or arr.size != stored.size:
                raise _bad(
                    f"push: key {pk[0]!r} holds {stored.dtype} of shape {tuple(info['shape'])} "
                    f"(piece of {stored.size} elements); got {arr.dtype} with {arr.size} elements"
                )
            why = self.rule.check(stored.dtype)
            if why is not None:
                raise _bad(f"push: key {pk[0]!r}: {why}")
        slot = self.held.setdefault(req.clock, {})
        for pk, arr in zip(pks, req.arrays, strict=True):
            mine = slot.setdefault(pk, {})
            mine[req.worker] = arr if req.worker not in mine else mine[req.worker] + arr
            self.stats["bytes_in"] += arr.nbytes
        self.stats["push"] += 1
        return self._ok(req)

    def _pull(self, req: WorkerRequest) -> list[Reply]:
        pks = self._pieces(req, "pull")

        def serve() -> Reply:
            arrays = [self.shards[pk].copy() for pk in pks]
            self.stats["pull"] += 1
            self.stats["bytes_out"] += sum(a.nbytes for a in arrays)
            return Reply(req.worker, req.req_id, PsStatus.OK, {}, arrays)

        def ready() -> bool:
            return self.policy.pull_ready(req.clock, self.slowest())

        return self._park_or_serve(req, ready, serve, "pull")

    def _barrier(self, req: WorkerRequest) -> list[Reply]:
        self.barriers[req.worker] += 1
        n = self.barriers[req.worker]

        def ready() -> bool:
            return all(c >= n for w, c in self.barriers.items() if w not in self.gone)

        return self._park_or_serve(req, ready, lambda: self._ok(req), "barrier")

    def _set_rule(self, req: WorkerRequest) -> Reply:
        if len(req.arrays) != 1:
            raise _bad("set_optimizer: expected one pickled rule")
        try:
            rule = pickle.loads(req.arrays[0].tobytes())
        except Exception as exc:
            raise _bad(
                f"set_optimizer: the rule cannot be unpickled on the server ({exc!r}); "
                "a custom function must be importable there"
            ) from None
        if not isinstance(rule, Rule):
            raise _bad(f"set_optimizer: expected a unison.ps Rule, got {type(rule).__name__}")
        self.rule = rule
        return self._ok(req)

    def _save(self, req: WorkerRequest) -> Reply:
        path = str(req.meta.get("path", ""))
        try:
            name = checkpoint.write_server(path, self.index, self.shards, self.info)
        except OSError as exc:
            raise _bad(f"save: server {self.index} cannot write {path!r}: {exc}") from None
        keys = {pk[0]: {"shape": i["shape"], "dtype": i["dtype"]} for pk, i in self.info.items()}
        return self._ok(req, {"file": name, "keys": keys})

    # --- progress: apply held pushes, answer parked requests --------------------------------
    def _park_or_serve(
        self, req: WorkerRequest, ready: Callable[[], bool], serve: Callable[[], Reply], what: str
    ) -> list[Reply]:
        self._apply_ready()
        if ready():
            return [serve()]
        self.stats["parked"] += 1
        self.parked.append(_Parked(req, self.now() + self.park_timeout, ready, serve, what))
        return []

    def _apply_ready(self) -> None:
        if self.failure is not None:
            return
        slowest = self.slowest()
        for clock in sorted(self.held):
            if not self.policy.apply_ready(clock, slowest):
                continue
            for pk, parts in sorted(self.held.pop(clock).items()):
                ranks = sorted(parts)
                total = parts[ranks[0]]
                if len(ranks) > 1:
                    total = total.copy()
                    for w in ranks[1:]:
                        total += parts[w]
                state = self.rule_state.setdefault(pk, {})
                try:
                    self.rule.apply(pk[0], self.shards[pk], total, state)
                except Exception as exc:
                    self.failure = CommunicationError(
                        f"server rank {self.rank}: update rule {self.rule!r} failed on key "
                        f"{pk[0]!r}: {exc!r}"
                    )
                    return

    def _progress(self) -> list[Reply]:
        self._apply_ready()
        out, keep = [], []
        for p in self.parked:
            if self.failure is not None:
                out.append(self._error(p.req, self.failure))
            elif p.ready():
                out.append(p.serve())
            else:
                keep.append(p)
        self.parked = keep
        return out
