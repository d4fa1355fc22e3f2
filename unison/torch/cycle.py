"""One negotiation cycle of :class:`~unison.torch.engine.TorchEngine`.

Split from :mod:`unison.torch.engine` (module functions on the engine, which holds all
state, as :mod:`unison.torch.exchange`): :func:`run_cycle` builds this rank's cycle
message (response-cache bits, fresh requests, inline payloads, the stall inspector's
shutdowns), exchanges it point to point or through the gathered lane
(:func:`lane_gather`), decides the same responses on every rank and executes them;
:func:`observe` feeds the lead's stall inspector.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .cache import and_bits, bits_to_ids, ids_to_bits
from .inline import payload
from .negotiation import TensorRequest, request_of

if TYPE_CHECKING:
    from .engine import TorchEngine

__all__ = ["decide", "lane_after", "lane_gather", "observe", "run_cycle"]


def run_cycle(self: TorchEngine) -> None:
    """Run cycle ``k`` (the next one) on the calling thread: build this rank's message,
    exchange it (point to point or gathered), decide alike on every rank, execute."""
    k = self._cycle + 1
    with self._cv:
        self._kick = False
        for e in self._new:
            self._pending[e.request.name] = e
        self._new = []
        entries = list(self._pending.values())
    if self.timeline is not None:
        self.timeline.cycle(time.perf_counter())
    ids: set[int] = set()
    fresh: list[TensorRequest] = []
    for e in entries:
        if e.announced:
            continue
        cid = self.cache.lookup(e.request, self.me)
        if cid is None:
            fresh.append(e.request)
            e.announced = True
        else:
            ids.add(cid)
    # rank 0 alone runs the stall inspector: what it shuts down travels in its message
    force: dict[str, str] = {}
    if self._lead and self._force:
        force, self._force = self._force, {}
    parts = payload(entries) if self.size > 1 else {}  # a set of one reduces nothing
    bits = ids_to_bits(ids)
    # "my next cycle may be gathered in one collective": pure response-cache traffic
    # that fits a record (packed now, used if this cycle is gathered that way too)
    steady = (
        bool(ids)
        and not fresh
        and not force
        and not self.coord.busy
        and self.lanes.steady(("C", k, bits, fresh, force, parts, True), self.cache)
    )
    mine = ("C", k, bits, fresh, force, parts, steady)
    self.counts["cycles"] += 1
    if self._lane_next:
        msgs = lane_gather(self, mine, k, steady)
    else:
        self.channel.send_all(mine)
        self.counts["control_sent"] += self.size - 1
        self._last_sent = time.monotonic()
        msgs = self._gather(k)
    msgs[self.me] = mine
    decide(self, k, msgs)


def decide(self: TorchEngine, k: int, msgs: dict[int, Any]) -> None:
    """Cycle ``k`` given every rank's message: decide alike on every rank, execute."""
    self._cycle = k
    with self._cv:
        self._attendance.record(msgs, self.size)
    # every rank holds every rank's message and the same coordinator table, so every
    # rank decides alike: no round trip to a coordinator, even for new requests
    coordinated = any(m[3] for m in msgs.values()) or bool(msgs[0][4]) or self.coord.busy
    # the next cycle is gathered when every message was steady and this one decides
    # everything every rank announced (the same bits everywhere): then no rank has
    # anything pending but what it submits next, which makes it enter at once
    self._lane_next = (
        self.size > 1
        and not coordinated
        and all(msgs[r][6] and msgs[r][2] == msgs[0][2] for r in range(self.size))
    )
    self.channel.listen = self._lane_next
    if not coordinated:
        ready = bits_to_ids(and_bits([msgs[r][2] for r in range(self.size)]))
        responses = [self.cache.get(i) for i in ready]
        if self._lead:
            observe(self, msgs)
    else:
        for r in range(self.size):
            m = msgs[r]
            self.coord.add(r, m[3])
            self.coord.add(r, [request_of(self.cache.get(i), r) for i in bits_to_ids(m[2])])
        if self._lead:
            observe(self, msgs)
        responses = self.coord.ready(msgs[0][4])
    if responses:
        self._execute(responses, [msgs[r][5] for r in range(self.size)])
    self._ended = time.monotonic()


def observe(self: TorchEngine, msgs: dict[int, Any]) -> None:
    """Coordinator: who holds which pending tensor (for the stall inspector)."""
    holders: dict[str, set[int]] = {}
    for r in range(self.size):
        for i in bits_to_ids(msgs[r][2]):
            holders.setdefault(self.cache.get(i).name, set()).add(r)
    for name, reqs in self.coord.table.items():
        holders.setdefault(name, set()).update(reqs)
    for r in self.coord.joined:
        for s in holders.values():
            s.add(r)
    self._holders = holders
    self.stall.observe(holders, time.monotonic())


def lane_gather(self: TorchEngine, mine: tuple[Any, ...], k: int, packed: bool) -> dict[int, Any]:
    """Cycle ``k``'s messages through one collective (every rank enters it; see
    :meth:`_wanted`); a message that did not fit comes point to point."""
    self.counts["lane"] += 1
    if not packed and not self.lanes.pack(mine, self.cache):
        self.channel.send_all(mine)
        self.counts["control_sent"] += self.size - 1
        self.lanes.mark(k, p2p=True)
    self._last_sent = time.monotonic()
    return lane_after(self, k, *self.lanes.exchange(k, self.cache, self.ranks))


def lane_after(
    self: TorchEngine, k: int, msgs: dict[int, Any], p2p: list[int], bye: list[int]
) -> dict[int, Any]:
    """The peers' messages of gathered cycle ``k``: goodbyes noted, point-to-point ones
    (records that said so) waited for."""
    if bye:
        with self._cv:
            self._gone.update(bye)
        self.channel.forget([self.ranks[r] for r in bye])
    if p2p:
        msgs.update(self._gather(k, p2p))
    return msgs
