"""Algorithm choice by cost, and UNISON_ALGO overrides."""

from __future__ import annotations

import pytest

from unison.algorithms import REGISTRY, Link, Topology, choose
from unison.algorithms.select import ALIASES
from unison.config import _ALGO_ALIASES, load_config
from unison.errors import InvalidArgumentError, UnsupportedError

LINK = Link(alpha=40e-6, beta=1 / 1.5e9, gamma=1 / 4e9)


def test_small_messages_pick_recursive_doubling_large_pick_ring() -> None:
    assert choose("all_reduce", 8, 8, LINK, {}).name == "recursive_doubling"
    assert choose("all_reduce", 8, 64 << 20, LINK, {}).name == "ring"


def test_every_algorithm_has_cost_and_supports() -> None:
    for coll, mods in REGISTRY.items():
        for m in mods:
            for p in (1, 2, 3, 8, 64):
                assert m.supports(p, 1024, Topology.of(LINK)) in (True, False)
                assert isinstance(m.NEEDS, str) and m.NEEDS, (coll, m.NAME)
                assert m.cost(p, 1024, LINK) >= 0, (coll, m.NAME)


def test_costs_follow_the_alpha_beta_model() -> None:
    from unison.algorithms import all_reduce_ring

    p, n = 4, 1 << 20
    want = 2 * 3 * LINK.alpha + 2 * 0.75 * n * LINK.beta + 0.75 * n * LINK.gamma
    assert all_reduce_ring.cost(p, n, LINK) == pytest.approx(want)


def test_override_forces_and_rejects_unknown() -> None:
    assert choose("all_reduce", 8, 64 << 20, LINK, {"all_reduce": "recursive_doubling"}).forced
    with pytest.raises(UnsupportedError, match="known all_reduce algorithms: ring"):
        choose("all_reduce", 8, 8, LINK, {"all_reduce": "nope"})


def test_algo_knob_parsing() -> None:
    cfg = load_config({"UNISON_ALGO": "all_reduce:ring, broadcast:binomial"})
    assert cfg.algo_overrides() == {"all_reduce": "ring", "broadcast": "binomial"}
    with pytest.raises(InvalidArgumentError, match="collective:algorithm"):
        load_config({"UNISON_ALGO": "ring"})


def test_old_collective_spellings_select_the_same_algorithm() -> None:
    """UNISON_ALGO is user-facing: ``allreduce``/``allgather``/``alltoall`` still work."""
    assert _ALGO_ALIASES == ALIASES
    old = load_config({"UNISON_ALGO": "allreduce:ring,allgather:shm,alltoall:pairwise"})
    assert old.algo_overrides() == {
        "all_reduce": "ring",
        "all_gather": "shm",
        "all_to_all": "pairwise",
    }
    for coll, spelled in (("all_reduce", "allreduce"), ("all_gather", "allgather")):
        new = choose(coll, 8, 8, LINK, {})
        assert choose(spelled, 8, 8, LINK, {}).name == new.name
        assert choose(spelled, 8, 8, LINK, {}).collective == coll
    forced = choose("allreduce", 8, 8, LINK, old.algo_overrides())
    assert forced.forced and forced.name == "ring" and forced.collective == "all_reduce"
    assert forced.module is choose("all_reduce", 8, 8, LINK, {"all_reduce": "ring"}).module
    assert sorted(REGISTRY) == sorted(
        [
            "all_reduce",
            "broadcast",
            "reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "gather",
            "scatter",
            "barrier",
        ]
    )


def test_eligibility_comes_from_the_topology() -> None:
    """The direct shared-memory algorithms need the shared slots; the hierarchical one
    needs ranks on several hosts, evenly. A forced one that is not eligible is refused,
    saying why, instead of silently running another algorithm."""
    from unison.link import SharedLink, TwoLevelLink

    shared = SharedLink()
    world = Topology(shared, shared=True, hosts=((0, 1, 2, 3),))
    sub = Topology(shared, shared=False, hosts=((0, 1),))  # a sub-group: no shared slots
    assert choose("all_reduce", 4, 1 << 20, world, {"all_reduce": "shm"}).name == "shm"
    assert choose("all_reduce", 2, 1 << 20, sub, {}).name != "shm"
    with pytest.raises(UnsupportedError, match=r"all_reduce:shm.*needs every rank on one host"):
        choose("all_reduce", 2, 1 << 20, sub, {"all_reduce": "shm"})
    with pytest.raises(UnsupportedError, match="needs ranks on more than one host"):
        choose("all_reduce", 4, 1 << 20, world, {"all_reduce": "hierarchical"})
    two = TwoLevelLink(intra=Link(), hosts=2, per_host=2)
    assert Topology.of(two).hosts == ((0, 1), (2, 3))
    assert choose("all_reduce", 4, 1 << 20, two, {"all_reduce": "hierarchical"}).forced
    uneven = Topology(two, hosts=((0, 1, 2), (3,)))
    with pytest.raises(UnsupportedError, match="the same number on each"):
        choose("all_reduce", 4, 1 << 20, uneven, {"all_reduce": "hierarchical"})


def test_one_phase_all_reduce_chosen_by_the_measured_model() -> None:
    """The one-phase shared-memory all-reduce saves a synchronisation and the copies of
    reduced slices, at the price of (p−1)·n reduced bytes per rank instead of
    ((p−1)/p)·n: the model picks it where that pays, from the link's own numbers, and
    refuses it without the shared slots (a sub-group, or the TCP transport)."""
    from unison.algorithms import all_reduce_shm, all_reduce_shm_one
    from unison.link import SharedLink, crowding

    # reduction as fast as a copy (what np.add into an operand measures on most hosts)
    link = SharedLink(alpha=20e-6, gamma=1 / 8e9, copy=1 / 8e9, sync=20e-6, cores=16)
    world = Topology(link, shared=True)
    for n in (1 << 20, 16 << 20, 256 << 20):
        assert choose("all_reduce", 2, n, world, {}).name == "shm_one"
    assert choose("all_reduce", 8, 16 << 20, world, {}).name == "shm"  # 7n reduced each
    # a slow reduction (e.g. a bfloat16 kernel) tips p = 2 at large n to the two phases
    slow = Topology(SharedLink(alpha=20e-6, gamma=1 / 1e9, copy=1 / 8e9, sync=20e-6), True)
    assert choose("all_reduce", 2, 256 << 20, slow, {}).name == "shm"
    # ranks outnumbering cores: every per-byte term grows by p / cores, syncs too
    small = SharedLink(alpha=20e-6, gamma=1 / 8e9, copy=1 / 8e9, sync=20e-6, cores=2)
    assert crowding(4, small) == 2.0 and crowding(2, small) == 1.0
    n = 1 << 20
    assert all_reduce_shm_one.cost(4, n, small) == pytest.approx(
        2 * 20e-6 + 2 * (n / 8e9 + 3 * n / 8e9)
    )
    assert all_reduce_shm.cost(4, n, small) > all_reduce_shm.cost(4, n, link)
    sub = Topology(link, shared=False)
    assert choose("all_reduce", 2, 1 << 20, sub, {}).name not in ("shm", "shm_one")
    with pytest.raises(UnsupportedError, match=r"all_reduce:shm_one.*needs every rank on one"):
        choose("all_reduce", 2, 1 << 20, sub, {"all_reduce": "shm_one"})
    with pytest.raises(UnsupportedError, match=r"all_reduce:shm_one"):
        choose("all_reduce", 2, 1 << 20, LINK, {"all_reduce": "shm_one"})


def test_single_copy_all_gather_needs_a_measured_cma_rate() -> None:
    """The cross-memory all-gather is priced by the measured process_vm_readv speed: not
    measured (0), never chosen; measured fast, chosen for large messages; refused
    without the shared slots (the TCP transport, a sub-group)."""
    from unison.algorithms import all_gather_cma
    from unison.link import SharedLink

    unknown = SharedLink(alpha=20e-6, copy=1 / 8e9, sync=20e-6)
    assert all_gather_cma.cost(2, 1 << 20, unknown) == float("inf")
    fast = SharedLink(alpha=20e-6, copy=1 / 8e9, cma=1 / 8e9, sync=20e-6)
    world = Topology(fast, shared=True)
    assert choose("all_gather", 2, 64 << 20, world, {}).name == "cma"  # one copy, not two
    assert choose("all_gather", 2, 64 << 20, world, {"all_gather": "cma"}).forced
    with pytest.raises(UnsupportedError, match=r"all_gather:cma.*process_vm_readv"):
        choose("all_gather", 2, 1 << 20, LINK, {"all_gather": "cma"})
    with pytest.raises(UnsupportedError, match=r"all_gather:cma"):
        choose("all_gather", 2, 1 << 20, Topology(fast, shared=False), {"all_gather": "cma"})


def test_out_of_cache_rates_apply_above_the_cache() -> None:
    """A measured link carries in-cache and out-of-cache per-byte rates; the selector
    and every cost() see the set that fits the operation's size."""
    from unison.algorithms import all_gather_cma, all_gather_shm
    from unison.link import SharedLink

    cold = SharedLink(alpha=20e-6, copy=1 / 3e9, cma=1 / 3.5e9, sync=20e-6)
    hot = SharedLink(alpha=20e-6, copy=1 / 20e9, cma=1 / 8e9, sync=20e-6, big=8 << 20, cold=cold)
    assert hot.at(8 << 20) is hot and hot.at((8 << 20) + 1) is cold
    world = Topology(hot, shared=True)
    # in cache a CMA copy costs more than two memcpys; out of cache, less
    assert choose("all_gather", 2, 1 << 20, world, {}).name == "shm"
    assert choose("all_gather", 2, 64 << 20, world, {}).name == "cma"
    n = 64 << 20
    assert choose("all_gather", 2, n, world, {}).predicted == pytest.approx(
        all_gather_cma.cost(2, n, cold)
    )
    assert all_gather_shm.cost(2, n, cold) > all_gather_shm.cost(2, n, hot)


def test_uncalibrated_host_picks_what_a_measured_one_does() -> None:
    """Without a calibration (init never measures) the typical figures must still lead
    to the direct shared-memory and single-copy algorithms; the older default link
    (no copy, reduction or cross-memory rates) chose the ring for every all-gather."""
    from unison import link as linkmodel
    from unison.transport import calibrate

    try:
        calibrate.install(cal=calibrate.typical({}))
        shared = linkmodel.shared_link(slots=True)
        topo = Topology.of(shared, 2)
        picks = {
            (coll, n): choose(coll, 2, n, topo, {}).name
            for coll, n in [
                ("all_reduce", 8),
                ("all_reduce", 1 << 20),
                ("all_gather", 1 << 20),
                ("all_gather", 16 << 20),
                ("reduce_scatter", 1 << 20),
                ("broadcast", 1 << 20),
            ]
        }
    finally:
        linkmodel.clear_measured()
    assert picks == {
        ("all_reduce", 8): "recursive_doubling",
        ("all_reduce", 1 << 20): "shm_one",
        ("all_gather", 1 << 20): "shm",
        ("all_gather", 16 << 20): "cma",
        ("reduce_scatter", 1 << 20): "shm",
        ("broadcast", 1 << 20): "shm",
    }
