"""Rounds in the store: the driver writes ``elastic/round/N`` (the whole assignment as
JSON) and then ``elastic/latest`` = N; workers read them. Rounds only grow."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..store import Store

__all__ = [
    "LATEST_KEY",
    "ROUND_KEY",
    "Assignment",
    "Round",
    "latest_round",
    "publish",
    "read_round",
]

LATEST_KEY = "elastic/latest"
ROUND_KEY = "elastic/round/{n}"


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


def latest_round(store: Store) -> int:
    """The newest round's number, -1 when none is published yet (does not block)."""
    if not store.check([LATEST_KEY]):
        return -1
    return int(store.get(LATEST_KEY, timeout=5.0))


def read_round(store: Store, number: int, timeout: float) -> Round:
    return Round.decode(store.get(ROUND_KEY.format(n=number), timeout=timeout))
