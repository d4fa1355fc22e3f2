"""What an algorithm receives: its rank and size in the group, and messaging.

An algorithm is a function ``run(ctx, ...)``. It names peers by *group* rank and
steps by small integers; the context turns them into transport keys (operation
kind, group, sequence number, step), waits with the operation's deadline, and
turns transport failures into errors that name the operation and the ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from .._types import OpCode, OpSig, ReduceOp
from ..buffers import DType
from ..errors import (
    AbortedError,
    CollectiveTimeoutError,
    CommunicationError,
    MismatchError,
    PeerLostError,
)
from ..link import Link
from ..transport.framing import FrameKind
from ..transport.request import Request
from .topology import Topology

__all__ = ["OpCode", "OpContext", "Router", "describe"]

_NO_TOPOLOGY = Topology(Link())  # contexts made outside a runtime (tests): no slots


def describe(sig: OpSig) -> str:
    """Human-readable form of an operation signature, e.g. ``all_reduce(SUM, float32 x 8)``."""
    try:
        name = OpCode(sig.op).label
    except ValueError:
        return f"unknown operation {sig.op}"
    parts = []
    if sig.redop or sig.op in (OpCode.ALL_REDUCE, OpCode.REDUCE, OpCode.REDUCE_SCATTER):
        try:
            parts.append(ReduceOp(sig.redop).name)
        except ValueError:
            parts.append(f"op {sig.redop}")
    try:
        dt = DType(sig.dtype).label
    except ValueError:
        dt = f"dtype {sig.dtype}"
    parts.append(f"{dt} x {sig.count}")
    if sig.root >= 0:
        parts.append(f"root={sig.root}")
    return f"{name}({', '.join(parts)})"


class Router(Protocol):
    """The communicator's view of the transports (peer → transport)."""

    def isend(
        self,
        peer: int,
        key: tuple[int, int, int, int],
        view: np.ndarray,
        sig: OpSig,
        deadline: float,
    ) -> Request: ...

    def irecv(
        self, peer: int, key: tuple[int, int, int, int], view: np.ndarray, sig: OpSig
    ) -> Request: ...

    def wait(self, req: Request, timeout: float) -> bool:
        """Wait for ``req`` at most ``timeout`` seconds (:meth:`Request.wait`), letting
        its transport make progress in this thread meanwhile."""
        ...

    def cancel(self, peer: int, req: Request) -> None: ...

    def explain(self, err: PeerLostError, peers: Sequence[int]) -> PeerLostError:
        """``err``, or when it reports a peer's orderly shutdown, the loss of one of
        ``peers`` that explains it (a peer that failed on a lost rank, then left)."""
        ...


def _bytes(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1).view(np.uint8)


class OpContext:
    """One collective in flight on one rank."""

    def __init__(
        self,
        router: Router,
        *,
        op: OpCode,
        group_id: int,
        seq: int,
        ranks: Sequence[int],
        rank: int,
        sig: OpSig,
        deadline: float,
        timeout: float,
        segment_bytes: int,
        tag_base: int = 0,
        topo: Topology = _NO_TOPOLOGY,
    ) -> None:
        self.router = router
        self.op = op
        self.group_id = group_id
        self.seq = seq
        self.ranks = tuple(ranks)  # group rank -> global rank
        self.rank = rank  # my group rank
        self.size = len(self.ranks)
        self.sig = sig
        self.deadline = deadline
        self.timeout = timeout
        self.segment_bytes = segment_bytes
        self.tag_base = tag_base
        self.topo = topo  # link, shared slots, host layout of the group
        #: for a signature confirmation: the signature of the operation it confirms
        self.data_sig: OpSig = sig
        #: a context running alongside on the same operation (the signature check);
        #: aborting this one aborts it too
        self.companion: OpContext | None = None
        #: set by an algorithm once every rank has received a signature-checked frame from
        #: every other rank in this operation: then all ranks provably agree on it
        self.all_pairs_checked = False
        #: called on a timeout with the peers this rank waits for; returns the silent ones
        #: (and notes on what the silent ranks are doing instead, if known)
        self.diagnose: Callable[[OpContext, list[int]], tuple[list[int], list[str]]] | None = None
        #: the barrier between the rounds of a direct shared-memory algorithm that the
        #: engine gives the operation (on its shared slots: signature-checked, with this
        #: operation's deadline and aborts); None: zero-byte messages
        #: (:func:`unison.algorithms.shm_arena.sync`)
        self.round_barrier: Callable[[OpContext, int], None] | None = None
        self._lock = threading.Lock()
        self._pending: list[Request] = []
        self._aborted: BaseException | None = None

    @property
    def label(self) -> str:
        """The operation this context's errors name: a signature confirmation's errors
        name the operation it confirms (the user called that one)."""
        if self.op is OpCode.CHECK:
            return OpCode(self.data_sig.op).label
        return self.op.label

    @property
    def name(self) -> str:
        return f"{self.label} #{self.seq} (group {self.group_id})"

    def seg_count(self, dtype: DType) -> int:
        """Elements per pipeline segment for this dtype."""
        return max(1, self.segment_bytes // max(1, dtype.itemsize))

    # --- messaging by group rank -----------------------------------------------------
    def _key(self, step: int) -> tuple[int, int, int, int]:
        return (int(FrameKind.COLL), self.group_id, self.seq, self.tag_base + step)

    def track(self, req: Request) -> Request:
        with self._lock:
            if self._aborted is not None:
                req.complete(self._aborted)
            self._pending.append(req)
        return req

    @property
    def aborted(self) -> BaseException | None:
        """The failure that aborted this operation (another rank's, a lost peer), or None."""
        return self._aborted

    def raise_if_aborted(self) -> None:
        """Post nothing once the operation is known to have failed elsewhere."""
        if self._aborted is not None:
            raise self._aborted

    def isend(self, peer: int, step: int, arr: np.ndarray) -> Request:
        self.raise_if_aborted()
        return self.track(
            self.router.isend(
                self.ranks[peer], self._key(step), _bytes(arr), self.sig, self.deadline
            )
        )

    def irecv(self, peer: int, step: int, arr: np.ndarray) -> Request:
        self.raise_if_aborted()
        return self.track(
            self.router.irecv(self.ranks[peer], self._key(step), _bytes(arr), self.sig)
        )

    def send(self, peer: int, step: int, arr: np.ndarray) -> None:
        self.wait(self.isend(peer, step, arr))

    def recv(self, peer: int, step: int, arr: np.ndarray) -> None:
        self.wait(self.irecv(peer, step, arr))

    def sendrecv(self, dst: int, sarr: np.ndarray, src: int, rarr: np.ndarray, step: int) -> None:
        r = self.irecv(src, step, rarr)
        s = self.isend(dst, step, sarr)
        self.wait(r, s)

    # --- waiting and failing -----------------------------------------------------------
    def wait(self, *reqs: Request) -> None:
        """Wait for every request, within the operation's deadline."""
        for req in reqs:
            left = self.deadline - time.monotonic()
            try:
                done = self.router.wait(req, max(left, 0.0))
            except MismatchError as exc:
                if exc is self._aborted:
                    raise
                raise self._mismatch(req, exc) from None
            except CommunicationError as exc:
                if self._aborted is not None:  # the root cause beats its consequences
                    raise self._aborted from None
                if isinstance(exc, PeerLostError):  # a peer that left may have left for another
                    exc = self.router.explain(exc, self.ranks)
                raise self.named(exc) from None
            if not done:
                raise self._timeout_error(req)

    def _timeout_error(self, req: Request) -> CollectiveTimeoutError:
        waiting = sorted({r.peer for r in self._pending if not r.done()} | {req.peer})
        return self.timeout_error(waiting)

    # --- the errors' wording (every path of an operation words them here) --------------
    def timeout_error(self, waiting: list[int]) -> CollectiveTimeoutError:
        """This operation timed out waiting for global ranks ``waiting``: the error naming
        the silent ones (:attr:`diagnose` tells them apart from ranks that also wait)."""
        silent, notes = self.diagnose(self, waiting) if self.diagnose else (waiting, [])
        me = self.ranks[self.rank]
        text = (
            f"{self.name} timed out after {self.timeout:g}s: "
            f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} did not answer"
        )
        if silent != waiting:
            text += f" (rank {me} was waiting for {', '.join(map(str, waiting))})"
        if notes:
            text += "; " + "; ".join(notes)
        return CollectiveTimeoutError(
            text, op=self.label, seq=self.seq, group=self.group_id, ranks=silent
        )

    def mismatch_error(self, peer: int, theirs: OpSig) -> MismatchError:
        """Global rank ``peer`` called ``theirs`` where this rank called this operation."""
        me = self.ranks[self.rank]
        if theirs.op == OpCode.CHECK:  # a confirmation's frame: it carries the call's fields
            theirs = theirs._replace(op=self.data_sig.op)
        return MismatchError(
            f"mismatched collective at {self.name}: rank {peer} called {describe(theirs)} "
            f"but rank {me} called {describe(self.data_sig)}",
            op=self.label,
            seq=self.seq,
            group=self.group_id,
            ranks=(peer, me),
        )

    def local_failure(self, exc: BaseException) -> CommunicationError:
        """The error peers are told when this rank's part failed with a non-unison ``exc``."""
        return CommunicationError(f"{self.name} failed locally: {exc!r}")

    def named(self, exc: CommunicationError) -> CommunicationError:
        """``exc`` naming this operation: a failure learnt outside it (a lost peer, another
        rank's abort) does not say which one it stopped. An error that names its operation
        is returned as is; an abort relayed from another rank keeps its payload."""
        if exc.op is not None:
            return exc
        err = type(exc)(
            f"{self.name}: {exc}",
            op=self.label,
            seq=self.seq,
            group=self.group_id,
            ranks=exc.ranks,
            remote=exc.remote,
        )
        err.abort_payload = exc.abort_payload
        return err

    def _mismatch(self, req: Request, exc: MismatchError) -> MismatchError:
        if req.sender_sig is not None and req.sender_sig != self.sig:
            return self.mismatch_error(req.peer, req.sender_sig)
        return MismatchError(
            f"mismatched message sizes at {self.name} ({describe(self.data_sig)}): {exc}",
            op=self.label,
            seq=self.seq,
            group=self.group_id,
            ranks=(req.peer, self.ranks[self.rank]),
        )

    def abort(self, exc: BaseException) -> None:
        """Fail this operation from another thread (peer lost, remote abort)."""
        with self._lock:
            if self._aborted is None:
                self._aborted = exc
            pending = list(self._pending)
        for req in pending:
            if not req.done():
                if req.view is not None and req.key[0] == FrameKind.COLL:
                    self.router.cancel(req.peer, req)
                req.complete(exc)
        if self.companion is not None:
            self.companion.abort(exc)

    def finish(self) -> None:
        """Withdraw receives that will never be waited for (after a failure)."""
        with self._lock:
            pending = [r for r in self._pending if not r.done()]
            self._pending.clear()
        for req in pending:
            self.router.cancel(req.peer, req)
            req.complete(AbortedError(f"{self.name} abandoned"))

    def reset_pending(self) -> None:
        """Forget finished requests (long operations keep the list short)."""
        with self._lock:
            self._pending = [r for r in self._pending if not r.done()]
