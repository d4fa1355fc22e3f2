"""Point-to-point on the native engine: one transport request per send or receive.

The shared layer (:meth:`unison.comm.group.Group.isend`) has validated the buffer,
the peer and the tag; here the buffer is posted on the fabric under the group's
p2p key and wrapped in a Work (:func:`request_work`) bounded by the job's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._types import OpCode, OpSig
from ...algorithms import describe
from ...buffers import Buffer
from ...comm.work import Work
from ...errors import CollectiveTimeoutError, CommunicationError, MismatchError
from ...transport.framing import FrameKind
from ...transport.matching import ANY_SOURCE
from ...transport.request import Request

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["post_recv", "post_send", "request_work"]


def request_work(
    name: str,
    req: Request,
    deadline: float,
    timeout: float,
    translate: Callable[[CommunicationError], CommunicationError],
    result: Any = None,
    cancel: Callable[[Request], None] | None = None,
    wait: Callable[[Request, float], bool] | None = None,
) -> Work:
    """A Work over one transport request, failed with a timeout at ``deadline``.
    ``cancel`` (receives only) withdraws the posted receive first, so a later message
    cannot land in the buffer; a finished receive's Work names its ``source``. ``wait``
    waits for the request (default :meth:`Request.wait`; the fabric's lets the
    transport make progress in the waiting thread)."""
    wait_for = wait or (lambda r, t: r.wait(t))

    def progress(work: Work, budget: float | None) -> bool:
        left = deadline - time.monotonic()
        try:
            done = wait_for(req, max(left if budget is None else min(budget, left), 0.0))
        except CommunicationError as exc:
            work.finish(result, translate(exc))
            return True
        if done:
            if cancel is not None:
                work.source = req.peer
            work.finish(result)
            return True
        if time.monotonic() < deadline:
            return False
        if cancel is not None:
            cancel(req)
        work.finish(
            result,
            CollectiveTimeoutError(
                f"{name} timed out after {timeout:g}s; not heard from rank {req.peer}",
                op=name,
                ranks=(req.peer,),
            ),
        )
        return True

    work = Work(name, progress=progress, result=result)
    work.request = req
    return work


def _key(ex: Executor, tag: int) -> tuple[int, int, int, int]:
    return (int(FrameKind.P2P), ex.id, 0, int(tag))


def post_send(ex: Executor, b: Buffer, peer: int, tag: int) -> Work:
    """Send the validated ``b`` to global rank ``peer`` on ``ex``'s group."""
    sig = ex.sig(OpCode.P2P, b.sig_dtype, b.count)
    rt = ex.rt
    deadline = time.monotonic() + ex.group.config.timeout
    req = rt.router.isend(peer, _key(ex, tag), b.array.view(np.uint8), sig, deadline)
    name = f"send to rank {peer} (tag {tag})"
    return request_work(
        name, req, deadline, ex.group.config.timeout, _error(ex, name), wait=rt.router.wait
    )


def post_recv(ex: Executor, b: Buffer, peer: int, tag: int) -> Work:
    """Receive from global rank ``peer`` (or ``ANY_SOURCE``) into the validated ``b``."""
    sig = ex.sig(OpCode.P2P, b.sig_dtype, b.count)
    rt = ex.rt
    deadline = time.monotonic() + ex.group.config.timeout
    view = b.array.view(np.uint8)
    if peer == ANY_SOURCE:
        req = rt.router.irecv_any(_key(ex, tag), view, sig)
        name = f"recv from any rank (tag {tag})"
    else:
        req = rt.router.irecv(peer, _key(ex, tag), view, sig)
        name = f"recv from rank {peer} (tag {tag})"
    return request_work(
        name,
        req,
        deadline,
        ex.group.config.timeout,
        _error(ex, name, sig),
        b.source,
        cancel=lambda r: rt.router.cancel(peer, r),
        wait=rt.router.wait,
    )


def _error(
    ex: Executor, name: str, mine: OpSig | None = None
) -> Callable[[CommunicationError], CommunicationError]:
    me = ex.rt.rank

    def translate(exc: CommunicationError) -> CommunicationError:
        if isinstance(exc, MismatchError) and mine is not None:
            theirs = getattr(exc, "sender_sig", None)
            sent = describe(theirs).replace("p2p", "") if theirs else "another size"
            return MismatchError(
                f"{name}: the message does not fit: rank {exc.ranks[0]} sent {sent} but "
                f"rank {me} expects {describe(mine).replace('p2p', '')}",
                op=name,
                ranks=(*exc.ranks, me),
            )
        return type(exc)(f"{name}: {exc}", op=name, ranks=exc.ranks)

    return translate
