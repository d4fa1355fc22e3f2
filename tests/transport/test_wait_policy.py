"""The wait policy learns its spin and yield budgets from what it observes, within its
safety rails, and never spins when ranks outnumber cores: it then yields once before
the futex, or (adaptive) yield-polls while that gives the shorter time per call."""

from __future__ import annotations

from unison.transport.wait_policy import (
    EPOCH,
    ONE_YIELD,
    SPIN_CAP_S,
    YIELD_CAP_S,
    YIELD_POLL,
    WaitPolicy,
)


def test_budgets_follow_observed_responses_within_the_rails() -> None:
    p = WaitPolicy(oversubscribed=False)
    assert 0 < p.spin_s <= SPIN_CAP_S and p.yields > 1
    for _ in range(50):  # peers answer in 5 us: spin about twice that, no more
        p.observe(5e-6)
    assert 5e-6 < p.spin_s <= 2.5e-5
    assert 2 * SPIN_CAP_S <= p.yield_s <= YIELD_CAP_S
    for _ in range(50):  # peers now take 1 ms: spinning would not pay, stop spinning
        p.observe(1e-3)
    assert p.spin_s == 0.0
    assert p.yield_s <= YIELD_CAP_S
    for _ in range(200):  # very slow peers (sleeping waits): the rails hold
        p.observe(1.0, blocked=True)
    assert p.spin_s == 0.0 and p.yield_s <= YIELD_CAP_S
    for _ in range(200):  # fast again: spinning comes back
        p.observe(2e-6)
    assert p.spin_s > 0.0


def test_oversubscribed_never_spins_and_yields_once() -> None:
    p = WaitPolicy(oversubscribed=True)
    for elapsed in (1e-6, 1e-5, 1e-3, 1e-6):
        for _ in range(20):
            p.observe(elapsed)
        assert p.spin_s == 0.0
        assert p.yields == 1


def _epochs(
    p: WaitPolicy, per_call: dict[int, float], epochs: int, state: list[float]
) -> list[int]:
    """Feed ``epochs`` epochs of waits, one call per wait, each arm costing
    ``per_call[arm]`` seconds per call; returns the arm each epoch ran."""
    arms = []
    for _ in range(epochs):
        arm = p.arm
        arms.append(arm)
        for _ in range(EPOCH):
            state[0] += per_call[arm]
            state[1] += 1
            p.observe(1e-5, False, int(state[1]), state[0])
    return arms


def test_adaptive_wait_takes_the_faster_way_and_keeps_measuring_the_other() -> None:
    p = WaitPolicy(oversubscribed=True, adapt=True)
    state = [1.0, 0.0]
    arms = _epochs(p, {ONE_YIELD: 100e-6, YIELD_POLL: 30e-6}, 80, state)
    assert p.yields > 1 and p.spin_s == 0.0  # yield-polling, never spinning
    late = arms[20:]
    assert late.count(YIELD_POLL) > 0.9 * len(late)
    assert ONE_YIELD in late  # explored now and then
    # the load changes: polling now costs far more; the policy goes back to one yield
    arms = _epochs(p, {ONE_YIELD: 100e-6, YIELD_POLL: 1e-3}, 120, state)
    assert arms[-40:].count(ONE_YIELD) > 0.9 * 40


def test_adaptive_wait_is_off_with_a_core_per_rank() -> None:
    p = WaitPolicy(oversubscribed=False, adapt=True)
    state = [1.0, 0.0]
    _epochs(p, {ONE_YIELD: 100e-6, YIELD_POLL: 30e-6}, 10, state)
    assert p.arm == ONE_YIELD and p.yields > 1  # the ordinary yield budget, unchanged


def test_inline_polls_cover_the_spin_budget_and_vanish_where_spinning_does_not_pay() -> None:
    p = WaitPolicy(oversubscribed=False)
    assert p.polls == 0  # the poll cost is unknown until the caller measured it
    p.poll_s = 1e-7
    for _ in range(50):
        p.observe(5e-6)
    assert p.polls == int(p.spin_s / p.poll_s) > 0
    for _ in range(50):  # slow peers: no spinning, so no inline polls either
        p.observe(1e-3)
    assert p.spin_s == 0.0 and p.polls == 0
    q = WaitPolicy(oversubscribed=True)
    q.poll_s = 1e-7
    for _ in range(20):
        q.observe(1e-6)
    assert q.polls == 0
