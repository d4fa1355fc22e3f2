"""How long a waiting rank spins, then yields, before it sleeps: learnt from what it sees.

A wait on shared memory has three phases: *spin* (poll the rings: a peer that is
already waiting answers within microseconds), *yield* (``sched_yield`` between
polls, so a peer that needs this core can run) and *block* (sleep on the
doorbell futex). Fixed phase lengths are right on one machine and wrong on the
next, so :class:`WaitPolicy` sets them from two observations:

* how long waits take to complete (an exponentially weighted mean ``response``):
  spinning is worth about twice the typical response and no more; yielding is
  worth a few typical responses before sleeping gives the core away for good;
* whether spinning would have paid off lately (``spin_hits``, the weighted share
  of waits that ended within the spin budget): when peers mostly answer later
  than that (a loaded or oversubscribed machine), the policy yields at once.

When ranks outnumber the usable cores the policy never spins, and it yields once
at most (``yields``) before it sleeps: the peer it waits for may need this very
core, and a ``sched_yield`` hands it over only if the scheduler agrees to run
that peer now — under the fair scheduler a yielder whose peer has used more than
its share is picked again at once, so a yield loop becomes a spin that steals
the peer's time slice (measured at np=4 on 2 cores: ~2 involuntary context
switches and hundreds of microseconds per 8-byte all_reduce). Sleeping on the
peer's futex gives the core away for certain; the peer wakes the sleeper when it
publishes. The numbers below are bounds (safety rails), not tuned values: never
spin longer than :data:`SPIN_CAP_S`, never yield longer than :data:`YIELD_CAP_S`
before sleeping, whatever was observed.
"""

from __future__ import annotations

__all__ = ["SPIN_CAP_S", "YIELD_CAP_S", "WaitPolicy"]

SPIN_CAP_S = 100e-6  # never burn more than this of a time slice without yielding
YIELD_CAP_S = 5e-3  # never yield-poll longer than this before sleeping on the futex
_WEIGHT = 0.125  # weight of one observation in the running means
_HIT_MIN = 0.25  # spin only while at least this share of waits ended within the budget


class WaitPolicy:
    """Spin and yield budgets (seconds) for the next wait, from the waits seen so far."""

    __slots__ = ("oversubscribed", "response", "spin_hits", "spin_s", "waits", "yield_s", "yields")

    def __init__(self, oversubscribed: bool) -> None:
        self.oversubscribed = oversubscribed
        self.response = 0.0  # mean seconds a wait took (0: nothing seen yet)
        self.spin_hits = 1.0  # optimistic until observed
        self.waits = 0
        self.spin_s = 0.0
        self.yield_s = 0.0
        #: at most this many ``sched_yield`` calls per wait before sleeping
        self.yields = 1 if oversubscribed else 1 << 30
        self._update()

    def _budget(self) -> float:
        """The spin budget the current mean response suggests (before the hit test)."""
        if self.response <= 0.0:
            return SPIN_CAP_S / 4  # nothing observed yet: a short first spin
        return min(2.0 * self.response, SPIN_CAP_S)

    def _update(self) -> None:
        spin = self._budget()
        if self.oversubscribed or self.spin_hits < _HIT_MIN:
            spin = 0.0
        self.spin_s = spin
        # yield for a few typical responses, at least as long as a spin would be
        self.yield_s = min(max(4.0 * self.response, 2.0 * SPIN_CAP_S), YIELD_CAP_S)

    def observe(self, elapsed: float, blocked: bool = False) -> None:
        """A wait ended after ``elapsed`` seconds (``blocked``: it went to sleep)."""
        hit = 1.0 if elapsed <= self._budget() else 0.0
        # a wait that slept says "slow" but its length is the peer's compute, not a
        # response time: count it as just past the yield budget so it cannot inflate it
        sample = min(elapsed, 2.0 * YIELD_CAP_S) if blocked else elapsed
        if self.waits == 0:
            self.response = sample
        else:
            self.response += _WEIGHT * (sample - self.response)
        self.spin_hits += _WEIGHT * (hit - self.spin_hits)
        self.waits += 1
        self._update()
