"""How long a waiting rank spins, then yields, before it sleeps: learnt from what it sees.

A wait on shared memory has three phases: *spin* (poll: a peer that is already
close answers within microseconds), *yield* (``sched_yield`` between polls, so a
peer that needs this core can run) and *block* (sleep on the peer's futex). Fixed
phase lengths are right on one machine and wrong on the next, so
:class:`WaitPolicy` sets them from two observations:

* how long waits take to complete (an exponentially weighted mean ``response``):
  spinning is worth about twice the typical response and no more; yielding is
  worth a few typical responses before sleeping gives the core away for good;
* whether spinning would have paid off lately (``spin_hits``, the weighted share
  of waits that ended within the spin budget): when peers mostly answer later
  than that (a loaded machine), the policy yields at once.

When ranks outnumber the usable cores the policy never spins, and it yields once
at most (``yields``) before it sleeps: the peer it waits for may need this very
core, and a ``sched_yield`` hands it over only if the scheduler agrees to run
that peer now — under the fair scheduler a yielder whose peer has used more than
its share is picked again at once, so a yield loop becomes a spin that steals
the peer's time slice. Sleeping on the peer's futex gives the core away for
certain; the peer wakes the sleeper when it publishes. (Yielding on while yields
do hand the core over — the thread's involuntary context switches move — was
measured against this, interleaved, at np=4 on 2 cores: no better under load, so
not taken.) The numbers below are bounds (safety rails), not tuned values: never
spin longer than :data:`SPIN_CAP_S`, never yield longer than :data:`YIELD_CAP_S`
before sleeping, whatever was observed.
"""

from __future__ import annotations

__all__ = ["SPIN_CAP_S", "YIELD_CAP_S", "WaitPolicy"]

SPIN_CAP_S = 100e-6  # never burn more than this of a time slice without yielding
YIELD_CAP_S = 5e-3  # never yield-poll longer than this before sleeping on the futex
_WEIGHT = 0.125  # weight of one observation in the running means
_HIT_MIN = 0.25  # spin only while at least this share of waits ended within the budget
_BLOCKED_S = 2.0 * YIELD_CAP_S  # what a wait that slept counts as, at most


class WaitPolicy:
    """Spin and yield budgets (seconds) for the next wait, from the waits seen so far."""

    __slots__ = (
        "_budget",
        "oversubscribed",
        "response",
        "spin_hits",
        "spin_s",
        "waits",
        "yield_s",
        "yields",
    )

    def __init__(self, oversubscribed: bool) -> None:
        self.oversubscribed = oversubscribed
        #: at most this many ``sched_yield`` calls per wait before sleeping
        self.yields = 1 if oversubscribed else 1 << 30
        self.response = 0.0  # mean seconds a wait took (0: nothing seen yet)
        self.spin_hits = 1.0  # optimistic until observed
        self.waits = 0
        self._budget = SPIN_CAP_S / 4  # nothing observed yet: a short first spin
        self.spin_s = 0.0 if oversubscribed else self._budget
        self.yield_s = 2.0 * SPIN_CAP_S

    def observe(self, elapsed: float, blocked: bool = False) -> None:
        """A wait ended after ``elapsed`` seconds (``blocked``: it went to sleep).

        Called right after a peer arrived, before the caller's result is ready, so
        it is plain arithmetic (no calls)."""
        # a wait that slept says "slow" but its length is the peer's compute, not a
        # response time: count it as just past the yield budget so it cannot inflate it
        sample = _BLOCKED_S if blocked and elapsed > _BLOCKED_S else elapsed
        resp = self.response + _WEIGHT * (sample - self.response) if self.waits else sample
        self.response = resp
        hits = self.spin_hits + _WEIGHT * (
            (1.0 if elapsed <= self._budget else 0.0) - self.spin_hits
        )
        self.spin_hits = hits
        self.waits += 1
        budget = 2.0 * resp if resp > 0.0 else SPIN_CAP_S / 4
        if budget > SPIN_CAP_S:
            budget = SPIN_CAP_S
        self._budget = budget
        self.spin_s = 0.0 if self.oversubscribed or hits < _HIT_MIN else budget
        # yield for a few typical responses, at least as long as a spin would be
        y = 4.0 * resp
        self.yield_s = (
            YIELD_CAP_S if y > YIELD_CAP_S else (y if y > 2.0 * SPIN_CAP_S else 2.0 * SPIN_CAP_S)
        )
