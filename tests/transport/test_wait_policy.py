"""The wait policy learns its spin and yield budgets from what it observes, within its
safety rails, and never spins (and yields once at most) when ranks outnumber cores."""

from __future__ import annotations

from unison.transport.wait_policy import SPIN_CAP_S, YIELD_CAP_S, WaitPolicy


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
