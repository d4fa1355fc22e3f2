"""Rounds in the store: the driver writes ``elastic/round/N`` (the whole assignment as
JSON) and then ``elastic/latest`` = N; workers read them. Rounds only grow."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..bootstrap import CANCEL_KEY
from ..store import Store

__all__ = [
    "LATEST_KEY",
    "ROUND_KEY",
    "Assignment",
    "Round",
    "cancel",
    "epoch_of",
    "latest_round",
    "publish",
    "read_round",
]

LATEST_KEY = "elastic/latest"
ROUND_KEY = "elastic/round/{n}"
#: round N's peer rendezvous runs under epoch ``EPOCH_BASE + N`` in the store (the native
#: runtime and the ps join worlds use :func:`epoch_of`), apart from non-elastic re-inits
EPOCH_BASE = 1 << 30


def epoch_of(number: int) -> int:
    """The rendezvous epoch of round ``number``."""
    return EPOCH_BASE + number


@dataclass(frozen=True)
class Assignment:
    """One worker's place in a round's world."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str


@dataclass(frozen=True)
class Round:
    """World number ``number``: worker id -> its assignment, and why it was formed."""

    number: int
    reason: str
    workers: dict[str, Assignment] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.workers)

    def encode(self) -> bytes:
        body = {
            "number": self.number,
            "reason": self.reason,
            "workers": {k: asdict(v) for k, v in self.workers.items()},
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Round:
        body = json.loads(raw)
        workers = {k: Assignment(**v) for k, v in body["workers"].items()}
        return cls(int(body["number"]), str(body["reason"]), workers)


def publish(store: Store, rnd: Round) -> None:
    """Make ``rnd`` the newest world (its assignment first, then the pointer)."""
    store.set(ROUND_KEY.format(n=rnd.number), rnd.encode())
    store.set(LATEST_KEY, str(rnd.number).encode())


def cancel(store: Store, number: int, reason: str) -> None:
    """Cancel round ``number``'s rendezvous if it is still forming: its workers stop
    waiting for a member that will never come (it died) and move on to the next round.
    A round that formed is not affected (its workers no longer look)."""
    store.set(CANCEL_KEY.format(epoch=epoch_of(number)), reason.encode())


def latest_round(store: Store) -> int:
    """The newest round's number, -1 when none is published yet (does not block)."""
    if not store.check([LATEST_KEY]):
        return -1
    return int(store.get(LATEST_KEY, timeout=5.0))


def read_round(store: Store, number: int, timeout: float) -> Round:
    return Round.decode(store.get(ROUND_KEY.format(n=number), timeout=timeout))
