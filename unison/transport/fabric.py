"""The fabric: every transport of this rank, and which one reaches each peer.

Bootstrap hands each authenticated TCP connection to the fabric; :meth:`Fabric.finish`
then decides, per peer, which transport carries data — the first whose
``can_connect`` accepts, in preference order (shared memory before TCP on one
host, as NCCL picks the first transport that can connect). ``UNISON_TRANSPORT``
forces one. The communicator talks to the fabric only (it is the algorithms'
``Router``), never to a transport directly.
"""

from __future__ import annotations

import socket

import numpy as np

from ..algorithms.cost import Link
from ..config import Config
from .base import Events, Key, PeerInfo, Transport
from .framing import OpSig
from .request import Request
from .tcp import TcpTransport

__all__ = ["Fabric"]


class Fabric:
    def __init__(self, rank: int, events: Events, config: Config) -> None:
        self.rank = rank
        self.config = config
        self.tcp = TcpTransport(rank, events, config.inline_send_bytes)
        self.transports: list[Transport] = [self.tcp]
        self.route: dict[int, Transport] = {}

    def adopt(self, peer: int, sock: socket.socket) -> None:
        """Bootstrap callback: an authenticated connection to ``peer``."""
        self.tcp.attach(peer, sock)

    def finish(self, infos: dict[int, PeerInfo]) -> None:
        """Choose the transport of every peer once all connections exist."""
        me = infos.get(self.rank)
        for peer, info in infos.items():
            if peer == self.rank:
                continue
            for t in self.transports:
                if me is None or t.can_connect(me, info):
                    self.route[peer] = t
                    break

    def link(self) -> Link:
        """α/β of the slowest transport in use (every rank computes the same)."""
        used = set(self.route.values()) or {self.tcp}
        return Link(max(t.alpha for t in used), max(t.beta for t in used))

    def _to(self, peer: int) -> Transport:
        return self.route.get(peer, self.tcp)

    # --- the Router interface used by algorithms and p2p -----------------------------
    def isend(self, peer: int, key: Key, view: np.ndarray, sig: OpSig, deadline: float) -> Request:
        return self._to(peer).isend(peer, key, view, sig, deadline)

    def irecv(self, peer: int, key: Key, view: np.ndarray, sig: OpSig) -> Request:
        return self._to(peer).irecv(peer, key, view, sig)

    def cancel(self, peer: int, req: Request) -> None:
        self._to(peer).cancel(req)

    def send_control(self, peer: int, ctl: int, payload: bytes) -> None:
        self._to(peer).send_control(peer, ctl, payload)

    def forget(self, group: int, seq: int) -> None:
        for t in self.transports:
            t.forget(group, seq)

    def close(self) -> None:
        for t in self.transports:
            t.close()
