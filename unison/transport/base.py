"""The transport seam: a handful of methods every transport provides.

A transport moves framed messages between this rank and its peers. Receives are
matched by (peer, key) with :class:`~unison.transport.matching.Matcher`; the data of
a matched message lands straight in the receiver's buffer.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._types import OpSig
from ..errors import MismatchError
from .matching import Matcher, Unexpected
from .request import Request

__all__ = ["Events", "Key", "MatchingTransport", "PeerInfo", "Transport"]

Key = tuple[int, int, int, int]  # (kind, group, seq, tag)


@dataclass(frozen=True)
class PeerInfo:
    """What a rank publishes at bootstrap."""

    rank: int
    host_id: str
    addr: str
    port: int
    pid: int


@dataclass
class Events:
    """Callbacks from a transport's I/O threads up to the communicator."""

    peer_lost: Callable[[int, str, bool], None]  # (peer, reason, graceful)
    abort: Callable[[int, dict[str, object]], None]  # (peer, decoded ABORT payload)
    #: a collective frame nobody was waiting for yet: (peer, key, sender's signature)
    unexpected: Callable[[int, Key, OpSig], None] = lambda peer, key, sig: None


class Transport(abc.ABC):
    """Framed, tag-matched messaging with a set of peers."""

    name: str = "?"  # its cost model is unison.link.transport_link(name)

    @abc.abstractmethod
    def can_connect(self, me: PeerInfo, peer: PeerInfo) -> bool:
        """Whether this transport can reach ``peer`` (shm: same host only)."""

    @abc.abstractmethod
    def isend(self, peer: int, key: Key, view: np.ndarray, sig: OpSig, deadline: float) -> Request:
        """Start sending ``view`` (uint8, contiguous) to ``peer`` under ``key``."""

    @abc.abstractmethod
    def irecv(self, peer: int, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        """Post a receive of exactly ``view.nbytes`` bytes from ``peer`` into ``view``."""

    def wait(self, req: Request, timeout: float) -> bool:
        """Wait for ``req`` (one of this transport's) at most ``timeout`` seconds: True
        once done (raising its failure), False if the time passed first. A transport may
        make progress in the waiting thread meanwhile (TCP reads its socket)."""
        return req.wait(timeout)

    @abc.abstractmethod
    def cancel(self, req: Request) -> None:
        """Withdraw a posted receive that will not be waited for."""

    @abc.abstractmethod
    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        """Best-effort control frame (abort, goodbye); never raises."""

    @abc.abstractmethod
    def forget(self, group: int, seq: int) -> None:
        """Drop buffered messages of an operation that failed."""

    def unexpected_sigs(self, group: int, seq: int) -> list[tuple[int, OpSig]]:
        """(peer, signature) of messages of one operation that nobody waits for yet."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Say goodbye to every peer and release sockets, threads and memory."""


class MatchingTransport(Transport):
    """A transport whose receives are matched by a :class:`Matcher`: the shared half of
    receiving (withdrawal, forgetting, copying an unexpected message in, mismatches)."""

    matcher: Matcher

    def cancel(self, req: Request) -> None:
        self.matcher.cancel(req)

    def forget(self, group: int, seq: int) -> None:
        self.matcher.drop_group_seq(group, seq)

    def unexpected_sigs(self, group: int, seq: int) -> list[tuple[int, OpSig]]:
        return self.matcher.unexpected_sigs(group, seq)

    @staticmethod
    def _mismatch(req: Request, sig: OpSig, length: int) -> MismatchError:
        """The error for a message that does not fit ``req`` (carries the sender's sig)."""
        req.sender_sig = sig
        err = MismatchError(
            f"rank {req.peer} sent {length} bytes for a message of {req.nbytes} bytes",
            ranks=(req.peer,),
        )
        err.sender_sig = sig  # type: ignore[attr-defined]
        return err

    def deliver_copy(self, req: Request, msg: Unexpected) -> None:
        """Complete ``req`` from a buffered message (or fail it if they disagree)."""
        if len(msg.data) != req.nbytes or req.sig != msg.sig:
            req.complete(self._mismatch(req, msg.sig, len(msg.data)))
            return
        if req.nbytes and req.view is not None:
            req.view[:] = np.frombuffer(msg.data, np.uint8)
        req.complete()
