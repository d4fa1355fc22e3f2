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
not taken.)

Which of the two is better depends on the machine and its load: on an otherwise
idle host the ranks sharing a core hand it to each other by yielding (what
OpenMPI's yield-when-idle does), and every sleep adds a wake-up; on a host full
of other processes a yield hands the core to a stranger for a whole slice, and
yield-polling costs far more than sleeping. With ``adapt`` (UNISON_WAIT_ADAPT) the
policy runs one or the other (:data:`ONE_YIELD`, :data:`YIELD_POLL`) for epochs
of :data:`EPOCH` waits, keeps each one's time per call (every call of the slots,
waited or not: what the caller's loop sees) and runs the faster, trying the other
now and then. The choice is local: ranks may differ, results do not.

The numbers below are bounds (safety rails), not tuned values: never
spin longer than :data:`SPIN_CAP_S`, never yield longer than :data:`YIELD_CAP_S`
before sleeping, whatever was observed.
"""

from __future__ import annotations

__all__ = ["EPOCH", "ONE_YIELD", "SPIN_CAP_S", "YIELD_CAP_S", "YIELD_POLL", "WaitPolicy"]

SPIN_CAP_S = 100e-6  # never burn more than this of a time slice without yielding
YIELD_CAP_S = 5e-3  # never yield-poll longer than this before sleeping on the futex
_WEIGHT = 0.125  # weight of one observation in the running means
_HIT_MIN = 0.25  # spin only while at least this share of waits ended within the budget
_BLOCKED_S = 2.0 * YIELD_CAP_S  # what a wait that slept counts as, at most
#: the two ways an oversubscribed wait goes: one ``sched_yield`` then the futex, or
#: ``sched_yield`` between polls for the yield budget (``yield_s``) before the futex
ONE_YIELD, YIELD_POLL = 0, 1
EPOCH = 64  # waits per epoch of one arm (adapt)
EXPLORE = 8  # every this many epochs the other arm runs one (adapt)
_KEEP = 5  # an arm's cost: the median of its last this many epochs (adapt)
_MARGIN = 0.8  # yield-poll only when its cost is below this share of one yield's (adapt)


class WaitPolicy:
    """Spin and yield budgets (seconds) for the next wait, from the waits seen so far."""

    __slots__ = (
        "_budget",
        "_epoch_k",
        "_epoch_t",
        "_epochs",
        "_seen",
        "adapt",
        "arm",
        "arm_cost",
        "oversubscribed",
        "poll_s",
        "polls",
        "response",
        "spin_hits",
        "spin_s",
        "waits",
        "yield_s",
        "yields",
    )

    def __init__(self, oversubscribed: bool, adapt: bool = False) -> None:
        self.oversubscribed = oversubscribed
        #: at most this many ``sched_yield`` calls per wait before sleeping
        self.yields = 1 if oversubscribed else 1 << 30
        self.response = 0.0  # mean seconds a wait took (0: nothing seen yet)
        self.spin_hits = 1.0  # optimistic until observed
        self.waits = 0
        self._budget = SPIN_CAP_S / 4  # nothing observed yet: a short first spin
        self.spin_s = 0.0 if oversubscribed else self._budget
        self.yield_s = 2.0 * SPIN_CAP_S
        #: seconds one poll of a peer's word takes here (set by the caller, measured; 0:
        #: unknown) and how many polls the caller runs inline, in place of the wait's
        #: spin phase (the spin budget's worth): a wait that ends there costs no clock
        #: reads and no bookkeeping, which would delay the waiter after its peer arrived,
        #: and teaches nothing (the budgets stay while they serve)
        self.poll_s = 0.0
        self.polls = 0
        #: oversubscribed: choose between the two ways of waiting (:data:`ONE_YIELD`,
        #: :data:`YIELD_POLL`) by the time per call each gave lately (:meth:`_epoch`)
        self.adapt = adapt and oversubscribed
        self.arm = ONE_YIELD
        #: seconds per call of each arm, the median of its last epochs (0: not tried yet)
        self.arm_cost = [0.0, 0.0]
        self._seen: tuple[list[float], list[float]] = ([], [])
        self._epoch_t = 0.0
        self._epoch_k = 0
        self._epochs = 0

    def observe(self, elapsed: float, blocked: bool = False, k: int = -1, now: float = 0.0) -> None:
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
        if self.adapt and self.waits % EPOCH == 0 and k >= 0:
            self._epoch(k, now)
        budget = 2.0 * resp if resp > 0.0 else SPIN_CAP_S / 4
        if budget > SPIN_CAP_S:
            budget = SPIN_CAP_S
        self._budget = budget
        self.spin_s = 0.0 if self.oversubscribed or hits < _HIT_MIN else budget
        poll = self.poll_s
        self.polls = int(self.spin_s / poll) if poll > 0.0 else 0
        # yield for a few typical responses, at least as long as a spin would be
        y = 4.0 * resp
        self.yield_s = (
            YIELD_CAP_S if y > YIELD_CAP_S else (y if y > 2.0 * SPIN_CAP_S else 2.0 * SPIN_CAP_S)
        )

    def _epoch(self, k: int, now: float) -> None:
        """End an epoch of :data:`EPOCH` waits at call ``k``: its time per call (every call
        of the slots since the epoch began, waited or not: what the caller's loop sees)
        joins its arm's last :data:`_KEEP` epochs, whose median is the arm's cost. The
        next epoch yield-polls only when that beats one yield by :data:`_MARGIN` (it
        burns the core while it waits: only for a clear gain), and runs the other arm
        now and then (load changes; each arm stays measured): every :data:`EXPLORE`-th
        epoch, up to 8 times less often when it was several times slower."""
        calls = (k - self._epoch_k) & 0xFFFFFFFF
        if self._epoch_t > 0.0 and calls > 0:
            seen = self._seen[self.arm]
            seen.append((now - self._epoch_t) / calls)
            if len(seen) > _KEEP:
                del seen[0]
            self.arm_cost[self.arm] = sorted(seen)[len(seen) // 2]
        self._epochs += 1
        c0, c1 = self.arm_cost
        if c0 == 0.0:
            arm = ONE_YIELD
        elif c1 == 0.0:
            arm = YIELD_POLL
        else:
            arm = YIELD_POLL if c1 < _MARGIN * c0 else ONE_YIELD
            # explore less often the further behind the other arm was: its epoch costs
            # about (ratio − 1) × an epoch, so the share it takes stays bounded
            ratio = c1 / c0 if c1 > c0 else c0 / c1
            if self._epochs % (EXPLORE * min(int(ratio), 8)) == 0:
                arm = 1 - arm
        self.arm = arm
        self.yields = 1 if arm == ONE_YIELD else 1 << 30
        self._epoch_t, self._epoch_k = now, k
