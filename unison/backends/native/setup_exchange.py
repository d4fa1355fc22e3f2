"""Set-up messages: what the fabric and the shared-memory set-up tell their peers.

Owns the one way set-up information travels: a fixed-size JSON message to each of
some peers and one back from each, over the already authenticated TCP connections,
under the fabric's own group id (never a user group's) and a tag per kind of
message. The tags of every set-up message live here, so no two kinds share one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from ..._types import OpSig
from ...errors import CollectiveTimeoutError
from ...transport.base import Key
from ...transport.framing import FrameKind
from ...transport.request import Request
from ...transport.tcp import TcpTransport

__all__ = ["ACK", "GROUP_ARENA", "HELLO", "Posted", "SetupExchange"]

FABRIC_GROUP = 0xFFFFFFFF  # group id of the set-up messages
MSG_BYTES = 2048  # every set-up message is this size (JSON, zero-padded)

#: tags: the shared-memory hello and ack (which carries the fabric's summary too), and
#: (plus the group id) a group's arena agreement
HELLO, ACK = 1, 2
GROUP_ARENA = 1 << 16


@dataclass
class Posted:
    """An exchange started by :meth:`SetupExchange.post`, finished by ``collect``."""

    bufs: dict[int, np.ndarray]
    recvs: dict[int, Request]
    sends: list[Request]


class SetupExchange:
    """This rank's set-up messages over TCP."""

    def __init__(self, rank: int, tcp: TcpTransport) -> None:
        self.rank = rank
        self.tcp = tcp

    def exchange(
        self,
        peers: list[int],
        tag: int,
        make: dict[int, dict[str, object]],
        deadline: float,
        op: str = "init",
    ) -> dict[int, dict[str, object]]:
        """Send ``make[peer]`` to each peer and receive theirs."""
        return self.collect(self.post(peers, tag, make, deadline), deadline, op)

    def post(
        self, peers: list[int], tag: int, make: dict[int, dict[str, object]], deadline: float
    ) -> Posted:
        """Start an exchange: post the receives, then the sends (without waiting)."""
        key = _key(tag)
        bufs = {p: np.zeros(MSG_BYTES, np.uint8) for p in peers}
        recvs = {p: self.tcp.irecv(p, key, bufs[p], OpSig()) for p in peers}
        sends = []
        for p in peers:
            raw = json.dumps(make[p]).encode()
            out = np.zeros(MSG_BYTES, np.uint8)
            out[: len(raw)] = np.frombuffer(raw, np.uint8)
            sends.append(self.tcp.isend(p, key, out, OpSig(), deadline))
        return Posted(bufs, recvs, sends)

    def collect(self, posted: Posted, deadline: float, op: str) -> dict[int, dict[str, object]]:
        """Finish an exchange :meth:`post` started: every peer's message."""
        got: dict[int, dict[str, object]] = {}
        for p, req in list(posted.recvs.items()) + [(-1, s) for s in posted.sends]:
            if not self.tcp.wait(req, max(0.0, deadline - time.monotonic())):
                what = "the transport set-up" if op == "init" else "the shared-arena set-up"
                raise CollectiveTimeoutError(
                    f"{op}: rank {req.peer} did not answer {what} (rank {self.rank})",
                    op=op,
                    ranks=[req.peer],
                )
            if p >= 0:
                got[p] = json.loads(posted.bufs[p].tobytes().rstrip(b"\0").decode())
        return got


def _key(tag: int) -> Key:
    return (int(FrameKind.P2P), FABRIC_GROUP, 0, tag)
