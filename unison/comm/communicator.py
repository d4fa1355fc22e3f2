"""A communicator: one group of ranks, its ordered queue, failure routing and p2p.

The collectives themselves (validation and algorithm calls) are in
:mod:`unison.comm.collectives`; this module runs them: it numbers each call,
builds its :class:`OpContext`, and when one fails on any rank it makes the
failure reach every member promptly (an ABORT control frame), after which the
group refuses further collectives instead of hanging or returning garbage.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..algorithms import OpCode, OpContext, Topology, describe
from ..buffers import Buffer, as_buffer
from ..errors import (
    AbortedError,
    CommunicationError,
    InvalidArgumentError,
    MismatchError,
)
from ..link import Link
from ..log import get_logger
from ..transport.framing import Control, Kind, OpSig
from ..transport.matching import ANY_SOURCE
from .desync import ROOTED, Confirmation, foreign_frame_error
from .ordered import OrderedQueue
from .work import RequestWork, Work

if TYPE_CHECKING:
    from .backend import Backend

__all__ = ["Communicator"]

log = get_logger("comm")
_NO_TOPOLOGY = Topology(Link())
_MAX_TAG = (1 << 32) - 1


class Communicator:
    """A group of ranks (the world or a sub-group) and the operations on it.

    Exposed publicly as :class:`unison.Group`. ``ranks`` are global ranks in group
    order; ``rank`` is this process's rank in the group (None for a non-member).
    """

    def __init__(self, rt: Any, gid: int, ranks: Sequence[int]) -> None:
        # rt: the job's runtime (the native Runtime or an external engine's
        # BackendRuntime, one layer up): identity, config, and the native engine's routes
        self.rt = rt
        self.id = gid
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.size = len(self.ranks)
        self.rank: int | None = self.ranks.index(rt.rank) if rt.rank in self.ranks else None
        #: the engine that runs this group's operations (chosen once, at init)
        self.backend: Backend = rt.backend
        #: the native engine's view of the group (link, shared slots, host layout)
        self.topo: Topology = _NO_TOPOLOGY
        self.queue = OrderedQueue(f"group-{gid}")
        self._lock = threading.Lock()
        self._seq = 0
        self._done = 0
        self._inflight: dict[int, OpContext] = {}
        self._early_aborts: dict[int, BaseException] = {}
        self._broken: BaseException | None = None
        self._notices: dict[int, dict[int, list[int]]] = {}  # seq -> {rank: waiting for}
        self._notice_cv = threading.Condition(self._lock)

    def __repr__(self) -> str:
        return f"<unison.Group {self.id} ranks={list(self.ranks)} rank={self.rank}>"

    # --- membership --------------------------------------------------------------------
    def require_member(self, what: str) -> int:
        if self.rank is None:
            raise InvalidArgumentError(
                f"{what}: rank {self.rt.rank} is not a member of group {self.id} "
                f"(ranks {list(self.ranks)})"
            )
        return self.rank

    def group_rank(self, global_rank: int, what: str) -> int:
        """Translate a global rank given as src/dst/root; it must belong to the group."""
        if isinstance(global_rank, bool) or not isinstance(global_rank, (int, np.integer)):
            raise InvalidArgumentError(f"{what} must be an int rank, got {global_rank!r}")
        if int(global_rank) not in self.ranks:
            raise InvalidArgumentError(
                f"{what}={global_rank} is not a rank of group {self.id} (ranks {list(self.ranks)})"
            )
        return self.ranks.index(int(global_rank))

    def sig(
        self, op: OpCode, dtype: int = 0, count: int = 0, redop: int = 0, root: int = -1
    ) -> OpSig:
        if not self.rt.config.check_mismatch:
            return OpSig(op=int(op))
        return OpSig(int(op), int(dtype), int(redop), int(root), int(count))

    # --- running collectives -------------------------------------------------------------
    def submit(self, op: OpCode, sig: OpSig, body: Callable[[OpContext], Any]) -> Work:
        """Number the operation now (issue order) and return its Work; it runs when the
        shared layer starts the Work (inline in the caller's thread if blocking and idle)."""
        me = self.rank
        assert me is not None  # members only: the shared layer checked
        hook = self.rt.op_hook
        if hook is not None:  # fault injection in tests: runs in the caller's thread
            hook(self, self._seq + 1, op)
        with self._lock:
            self._seq += 1
            seq = self._seq

        def launch(inline: bool) -> None:
            self.queue.run(task, inline=inline)

        work = Work(f"{op.label} #{seq} (group {self.id})", launch)

        def task() -> None:
            self._execute(seq, me, op, sig, body, work)

        return work

    def _execute(
        self,
        seq: int,
        me: int,
        op: OpCode,
        sig: OpSig,
        body: Callable[[OpContext], Any],
        work: Work,
    ) -> None:
        cfg = self.rt.config
        ctx = OpContext(
            self.rt.router,
            op=op,
            group_id=self.id,
            seq=seq,
            ranks=self.ranks,
            rank=me,
            sig=sig,
            deadline=time.monotonic() + cfg.timeout,
            timeout=cfg.timeout,
            segment_bytes=cfg.segment_bytes,
            topo=self.topo,
        )
        ctx.diagnose = self._diagnose_timeout
        with self._lock:
            early = self._broken_error(ctx) or self._early_aborts.pop(seq, None)
            if early is None:
                self._inflight[seq] = ctx
        if early is not None:
            work._finish(error=early)
            with self._lock:
                self._done = max(self._done, seq)
            return
        try:
            self._scan_buffered(ctx)
            result = body(ctx)
            if op in ROOTED and cfg.check_mismatch and self.size > 1 and not ctx.all_pairs_checked:
                Confirmation(ctx, self._check_context(ctx)).finish()
        except CommunicationError as exc:
            self._fail(ctx, exc)
            work._finish(error=exc)
        except BaseException as exc:
            self._fail(ctx, CommunicationError(f"{ctx.name} failed locally: {exc!r}"))
            work._finish(error=exc)
        else:
            work._finish(result)
        finally:
            with self._lock:
                self._inflight.pop(seq, None)
                self._notices.pop(seq, None)
                self._done = max(self._done, seq)

    def _check_context(self, ctx: OpContext) -> OpContext:
        """A context for the signature confirmation, aborted whenever ``ctx`` is."""
        check = OpContext(
            self.rt.router,
            op=OpCode.CHECK,
            group_id=self.id,
            seq=ctx.seq,
            ranks=self.ranks,
            rank=ctx.rank,
            sig=OpSig(op=int(OpCode.CHECK)),
            deadline=ctx.deadline,
            timeout=ctx.timeout,
            segment_bytes=1 << 16,
            tag_base=1 << 31,
        )
        check.data_sig = ctx.sig
        check.diagnose = self._diagnose_timeout
        with self._lock:
            ctx.companion = check
            late = ctx._aborted
        if late is not None:
            check.abort(late)
        return check

    def _broken_error(self, ctx: OpContext) -> BaseException | None:
        if self._broken is None:
            return None
        return AbortedError(
            f"{ctx.name} refused: group {self.id} is unusable since an earlier failure: "
            f"{self._broken}",
            op=ctx.op.label,
            seq=ctx.seq,
            group=self.id,
            ranks=getattr(self._broken, "ranks", ()),
        )

    def _fail(self, ctx: OpContext, exc: BaseException) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = exc
        ctx.finish()
        self.rt.forget(self.id, ctx.seq)
        relayed = exc.abort_payload if isinstance(exc, CommunicationError) else None
        if relayed is not None:
            # Learnt from another rank: pass the same news on before this rank can exit,
            # so every peer hears it ahead of our goodbye (streams are ordered per peer).
            payload = relayed
        else:
            kind = "mismatch" if isinstance(exc, MismatchError) else type(exc).__name__
            payload = json.dumps(
                {
                    "group": self.id,
                    "seq": ctx.seq,
                    "kind": kind,
                    "message": str(exc),
                    "origin": self.rt.rank,
                }
            ).encode()
        for peer in self.ranks:
            if peer != self.rt.rank:
                self.rt.send_control(peer, Control.ABORT, payload)

    # --- failures reported by other ranks or the transport -----------------------------------
    def remote_abort(self, seq: int, exc: BaseException) -> None:
        with self._lock:
            ctx = self._inflight.get(seq)
            if ctx is None:
                if seq > self._done:
                    self._early_aborts[seq] = exc
                elif self._broken is None:
                    self._broken = exc
                return
        ctx.abort(exc)

    def _diagnose_timeout(self, ctx: OpContext, waiting: list[int]) -> tuple[list[int], list[str]]:
        """Tell the group this rank timed out, hear who else did; the rest are silent."""
        me = self.rt.rank
        payload = json.dumps(
            {
                "group": self.id,
                "seq": ctx.seq,
                "kind": "timeout-notice",
                "origin": me,
                "waiting": waiting,
                "doing": f"{ctx.name} {describe(ctx.data_sig)}",
            }
        ).encode()
        for peer in self.ranks:
            if peer != me:
                self.rt.send_control(peer, Control.ABORT, payload)
        grace = time.monotonic() + min(1.0, 0.25 * ctx.timeout)
        others = [r for r in self.ranks if r != me]
        with self._notice_cv:
            while len(self._notices.get(ctx.seq, {})) < len(others):
                left = grace - time.monotonic()
                if left <= 0:
                    break
                self._notice_cv.wait(left)
            reported = set(self._notices.get(ctx.seq, {}))
        silent = [r for r in others if r not in reported] or waiting
        notes = []
        for r in silent:
            elsewhere = self.rt.stuck.get(r)
            if elsewhere is not None and (elsewhere[0], elsewhere[1]) != (self.id, ctx.seq):
                notes.append(
                    f"rank {r} is itself blocked in {elsewhere[2]}: the ranks are in different "
                    "collectives (or groups)"
                )
        return silent, notes

    def timeout_notice(self, seq: int, origin: int, waiting: list[int]) -> None:
        with self._notice_cv:
            if seq > self._done or seq in self._inflight:
                self._notices.setdefault(seq, {})[origin] = waiting
                self._notice_cv.notify_all()

    def foreign_frame(self, seq: int, peer: int, sig: OpSig) -> None:
        """A frame for operation ``seq`` arrived unasked; if it is another op, fail now."""
        with self._lock:
            ctx = self._inflight.get(seq)
        if ctx is None or not self.rt.config.check_mismatch:
            return
        err = foreign_frame_error(ctx, peer, sig)
        if err is not None:
            ctx.abort(err)

    def _scan_buffered(self, ctx: OpContext) -> None:
        """Frames of this operation that arrived before it started may already disagree."""
        if not self.rt.config.check_mismatch:
            return
        for t in self.rt.fabric.transports:
            for peer, sig in t.unexpected_sigs(self.id, ctx.seq):
                err = foreign_frame_error(ctx, peer, sig)
                if err is not None:
                    ctx.abort(err)
                    return

    def mark_broken(self, exc: BaseException) -> None:
        """An operation failed leaving the engine's state unknown: refuse later calls."""
        with self._lock:
            if self._broken is None:
                self._broken = exc

    def peer_lost(self, exc: CommunicationError) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = exc
            running = list(self._inflight.values())
        for ctx in running:
            ctx.abort(exc)

    # --- point-to-point ----------------------------------------------------------------------
    def p2p_args(
        self, buf: Any, peer: int, tag: int, what: str, writable: bool
    ) -> tuple[Buffer, int]:
        """Validate a send/recv once: membership, buffer, peer (a global rank), tag."""
        self.require_member(what)
        b = as_buffer(buf, what, writable=writable)
        self.group_rank(peer, "dst" if what == "send" else "src")
        if int(peer) == self.rt.rank:
            raise InvalidArgumentError(f"{what}: rank {peer} cannot {what} to itself")
        if (
            isinstance(tag, bool)
            or not isinstance(tag, (int, np.integer))
            or not 0 <= int(tag) <= _MAX_TAG
        ):
            raise InvalidArgumentError(f"{what}: tag must be an int in [0, 2**32), got {tag!r}")
        return b, int(peer)

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``buf`` to global rank ``dst`` on this group's engine."""
        b, peer = self.p2p_args(buf, dst, tag, "send", writable=False)
        return self.backend.isend(self, b, peer, int(tag))

    def irecv(self, buf: Any, src: int | None, tag: int = 0) -> Work:
        """Start receiving from global rank ``src`` into ``buf`` on this group's engine;
        ``src=None``: from any rank of the group (the Work's ``source`` is the sender)."""
        if src is None:
            b, _ = self.p2p_args(
                buf,
                self.ranks[0] if self.rt.rank != self.ranks[0] else self.ranks[-1],
                tag,
                "recv",
                writable=True,
            )
            return self.backend.irecv(self, b, ANY_SOURCE, int(tag))
        b, peer = self.p2p_args(buf, src, tag, "recv", writable=True)
        return self.backend.irecv(self, b, peer, int(tag))

    def post_send(self, b: Buffer, peer: int, tag: int) -> Work:
        """The native engine's send of a validated buffer."""
        sig = self.sig(OpCode.P2P, b.dtype, b.count)
        cfg = self.rt.config
        deadline = time.monotonic() + cfg.timeout
        req = self.rt.router.isend(
            peer, (int(Kind.P2P), self.id, 0, int(tag)), b.array.view(np.uint8), sig, deadline
        )
        name = f"send to rank {peer} (tag {tag})"
        return RequestWork(name, req, deadline, cfg.timeout, self._p2p_error(name))

    def post_recv(self, b: Buffer, peer: int, tag: int) -> Work:
        """The native engine's receive into a validated buffer."""
        sig = self.sig(OpCode.P2P, b.dtype, b.count)
        cfg = self.rt.config
        deadline = time.monotonic() + cfg.timeout
        key = (int(Kind.P2P), self.id, 0, int(tag))
        if peer == ANY_SOURCE:
            req = self.rt.router.irecv_any(key, b.array.view(np.uint8), sig)
            name = f"recv from any rank (tag {tag})"
        else:
            req = self.rt.router.irecv(peer, key, b.array.view(np.uint8), sig)
            name = f"recv from rank {peer} (tag {tag})"
        return RequestWork(
            name,
            req,
            deadline,
            cfg.timeout,
            self._p2p_error(name, sig),
            b.source,
            cancel=lambda r: self.rt.router.cancel(peer, r),
        )

    def _p2p_error(
        self, name: str, mine: OpSig | None = None
    ) -> Callable[[CommunicationError], CommunicationError]:
        def translate(exc: CommunicationError) -> CommunicationError:
            if isinstance(exc, MismatchError) and mine is not None:
                theirs = getattr(exc, "sender_sig", None)
                sent = describe(theirs).replace("p2p", "") if theirs else "another size"
                return MismatchError(
                    f"{name}: the message does not fit: rank {exc.ranks[0]} sent {sent} but "
                    f"rank {self.rt.rank} expects {describe(mine).replace('p2p', '')}",
                    op=name,
                    ranks=(*exc.ranks, self.rt.rank),
                )
            return type(exc)(f"{name}: {exc}", op=name, ranks=exc.ranks)

        return translate

    def close(self) -> None:
        self.queue.close()
