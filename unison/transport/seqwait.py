"""How a rank waits for its peers on the slots (:mod:`.seqslot`): spin, yield, sleep.

The phases follow :class:`~.wait_policy.WaitPolicy`. The sleep is on the ``seq``
word of the peer still missing (its ``sleepers`` flag set first), which that peer
wakes when it publishes; a bounded sleep (:data:`SLEEP_S`) covers a lost wake-up.

(A group-wide bell, one futex word that every member sleeps on and the last
publisher rings once, was measured against this at np=4 on 2 cores: the same
sleeps and context switches per call, a rank is seldom woken by more than one
peer per call; not kept.)
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import TYPE_CHECKING

from . import futex

if TYPE_CHECKING:
    from .seqslot import SeqSlots
    from .wait_policy import WaitPolicy

__all__ = ["MASK", "SLEEP_S", "fence_in", "fence_out", "poll_cost", "wait"]

MASK = 0xFFFFFFFF
SLEEP_S = 0.005  # a sleeping waiter re-checks this often (bounds a lost wake-up)
CHECK_S = 0.001  # a waiter looks for failures elsewhere and its deadline this often
# a store-load fence: an uncontended lock's acquire and release (a locked instruction
# on x86-64; the futex call fences the waiter's side; SLEEP_S bounds a miss elsewhere)
_FENCE = threading.Lock()
fence_in, fence_out = _FENCE.acquire, _FENCE.release


def wait(
    slots: SeqSlots, k: int, sig: int, timeout: float, policy: WaitPolicy, spun: bool = False
) -> None:
    """Until every peer published ``k``: spin, yield, then sleep; deadline-bound.

    Only waits that had to wait get here (and teach ``policy``): a call whose
    peers had all arrived returns without reading the clock, and so does one whose
    peers arrived within the caller's inline polls (``spun``: those ran, this wait
    starts at its yield phase)."""
    start = now = time.monotonic()
    deadline = start + timeout
    patient = slots.patient
    if patient:  # the caller expects a long wait: sleep at once, learn nothing
        spin_end = yield_end = start
    else:
        spin_end = start if spun else start + policy.spin_s
        yield_end = spin_end + policy.yield_s
    check_at = start + CHECK_S
    yields = policy.yields
    blocked = False
    for q, seq in slots.peer_seq_items:  # all must arrive: wait for each in turn
        n = 0
        while (seq.value - k) & MASK > 1:
            n += 1
            if now < spin_end:
                if n & 7 == 0:  # a few cheap polls between clock reads
                    now = time.monotonic()
                continue
            now = time.monotonic()
            if now >= check_at:  # failures elsewhere, the deadline: now and then
                check_at = now + CHECK_S
                slots.check_failures(k, sig, timeout, now >= deadline)
            if now < yield_end and yields > 0:
                yields -= 1
                os.sched_yield()
                continue
            blocked = True  # sleep until this peer publishes (or a bounded re-check)
            seen = seq.value
            slots.sleepers[q].value = 1
            if (seen - k) & MASK > 1:
                futex.wait(slots.addrs[q], seen, min(SLEEP_S, max(deadline - now, 1e-4)))
    if not patient:
        end = time.monotonic()
        policy.observe(end - start, blocked, k, end)


def poll_cost(word: ctypes.c_uint32, polls: int = 256) -> float:
    """Seconds one poll of a slot word takes here (what the inline polls before
    :func:`wait` run): the mean of ``polls`` polls, timed once."""
    k = word.value
    t = time.perf_counter()
    n = polls
    while n:
        if (word.value - k) & MASK > 1:
            break
        n -= 1
    return (time.perf_counter() - t) / polls
