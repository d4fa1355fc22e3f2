"""unison simulate: unit parsing, the selector's own cost functions, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from unison.algorithms import all_reduce_hierarchical, all_reduce_ring
from unison.errors import InvalidArgumentError
from unison.launch.cli import main as cli_main
from unison.link import Link, TwoLevelLink
from unison.simulate import build_link, parse_bandwidth, parse_latency, parse_size, predict

pytestmark = pytest.mark.timeout(30)


def test_units() -> None:
    assert parse_size("1G") == 1 << 30 and parse_size("64K") == 65536 and parse_size("3") == 3
    assert parse_bandwidth("100Gbit") == pytest.approx(12.5e9)
    assert parse_bandwidth("300GB/s") == pytest.approx(300e9)
    assert parse_latency("5us") == pytest.approx(5e-6) and parse_latency("2ms") == 2e-3
    for bad in ("fast", "-1G"):
        with pytest.raises(InvalidArgumentError):
            parse_size(bad)
    with pytest.raises(InvalidArgumentError, match="latency"):
        build_link(8, 1, "100Gbit,10GB/s", "", 1e-9)
    with pytest.raises(InvalidArgumentError, match="multiple"):
        build_link(10, 3, "100Gbit,5us", "300GB/s,1us", 1e-9)


def test_two_level_link_and_formulas() -> None:
    link = build_link(1024, 128, "100Gbit,5us", "300GB/s,1us", 1 / 4e9)
    assert isinstance(link, TwoLevelLink)
    assert (link.hosts, link.per_host) == (128, 8)
    assert link.alpha == pytest.approx(5e-6) and link.intra.alpha == pytest.approx(1e-6)
    n, p = 1 << 30, 1024
    ring = predict("ring", p, n, link)
    want = 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / 12.5e9 + (p - 1) / p * n / 4e9
    assert ring.seconds == pytest.approx(want)
    assert ring.busbw == pytest.approx(n / want * 2 * (p - 1) / p)
    # the very functions the selector evaluates
    assert ring.seconds == all_reduce_ring.cost(p, n, link)
    assert predict("hierarchical", p, n, link).seconds == all_reduce_hierarchical.cost(p, n, link)
    assert predict("hierarchical", p, n, link).seconds < ring.seconds
    flat = build_link(8, 1, "100Gbit,5us", "", 1 / 4e9)
    assert type(flat) is Link and math.isinf(predict("hierarchical", 8, n, flat).seconds)
    with pytest.raises(InvalidArgumentError, match="known"):
        predict("magic", 8, n, flat)


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--np", "1024", "--hosts", "128", "--link", "100Gbit,5us"]
    assert cli_main([*argv, "--intra", "300GB/s,1us", "--size", "1K,1G"]) == 0
    out = capsys.readouterr().out
    assert "p=1024 hosts=128" in out and "hierarchical" in out
    rows = [ln for ln in out.splitlines() if ln.strip().startswith(("1K", "1G"))]
    assert len(rows) == 2 and all("*" in r for r in rows)


def test_validate_against_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"impl": "unison", "op": "all_reduce", "np": 2, "size": 1 << 20, "time_us": 300.0},
        {"impl": "gloo", "op": "all_reduce", "np": 2, "size": 1 << 20, "time_us": 900.0},
    ]
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"meta": {}, "rows": rows}))
    assert cli_main(["simulate", "--validate", str(f)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "300.0 us" in lines[1] and "%" in lines[1]


def test_validate_covers_every_measured_collective(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each collective's row is priced with that collective's choice, overhead included;
    skipped rows (no time) are left out."""
    rows = [
        {"impl": "unison", "op": op, "np": 2, "size": 1 << 24, "time_us": 5000.0}
        for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
    ]
    rows.append({"impl": "unison", "op": "all_gather", "np": 4, "size": 8, "skipped": "x"})
    rows.append({"impl": "unison", "op": "all_to_all", "np": 2, "size": 64, "time_us": 9.0})
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"meta": {}, "rows": rows}))
    assert cli_main(["simulate", "--validate", str(f)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert [ln.split()[0] for ln in lines] == [
        "all_reduce",
        "broadcast",
        "all_gather",
        "reduce_scatter",
    ]
    assert all("5.00 ms" in ln and ln.rstrip().endswith("%") for ln in lines)


def test_broadcast_rounds_overlap_and_all_gather_counts_the_own_block() -> None:
    """The shm broadcast's rounds overlap (root fills one half while readers empty the
    other), even within one half: only the first round's copy in adds to the copies out;
    all-gathers pay the copy of the own block into the output (every algorithm alike)."""
    import math

    from unison.algorithms import all_gather_ring, all_gather_shm, broadcast_shm
    from unison.algorithms.shm_arena import pipeline_bytes
    from unison.link import SharedLink

    link = SharedLink(alpha=1e-6, beta=1e-9, copy=1e-10, half=1 << 20, sync=1e-6, cores=2)
    for p, n, sync, crowd in (
        (2, 1 << 20, 1e-6, 1),
        (2, 16 << 20, 1e-6, 1),
        (4, 16 << 20, 2e-6, 2),
    ):
        b = pipeline_bytes(p, n, link)
        assert 4096 <= b < min(n, 1 << 20)  # pipelined: several rounds even in one half
        k = math.ceil(n / b)
        assert abs(k - math.sqrt(n * 1e-10 / sync)) <= 1 + n / (1 << 20) / 2
        want = sync * k + (crowd * n + b) * 1e-10  # sync x ranks/core when crowded
        assert broadcast_shm.cost(p, n, link) == pytest.approx(want)
    n = 8 << 20
    own = all_gather_ring.own_copy(2, n, link)
    assert own == pytest.approx(n / 2 * 1e-10)
    r = all_gather_shm.round_size(2, n, link)  # bytes of the own block per round
    assert all_gather_shm.cost(2, n, link) == pytest.approx(
        1e-6 * math.ceil(n / 2 / r) + n * 1e-10 + own
    )


def test_model_reads_the_measured_slot_sync() -> None:
    """The measured round sync (2 ranks on 2 cores; 2 ranks per core) reaches the shared
    link from the shm link, and grows linearly in ranks per core through both points."""
    from unison.link import SharedLink, shared_link, sync_at

    cold = Link(alpha=20e-6, beta=2e-10, sync=4e-6, sync_crowded=30e-6)
    base = Link(alpha=20e-6, beta=1e-10, sync=4e-6, sync_crowded=30e-6, big=1 << 20, cold=cold)
    link = shared_link(base, slots=True)
    assert link.sync == 4e-6 and link.sync_crowded == 30e-6
    assert isinstance(link.at(2 << 20), SharedLink) and link.at(2 << 20).sync == 4e-6
    assert shared_link(base).sync == 0.0  # no slots: zero-byte messages, priced by α
    unmeasured = shared_link(Link(alpha=20e-6), slots=True)
    assert unmeasured.sync == 20e-6 and unmeasured.sync_crowded == 0.0  # α, as before
    two = SharedLink(alpha=20e-6, sync=4e-6, sync_crowded=30e-6, cores=2)
    assert sync_at(2, two) == 4e-6 and sync_at(1, two) == 4e-6
    assert sync_at(4, two) == pytest.approx(30e-6)  # the measured crowded point
    assert sync_at(3, two) == pytest.approx(17e-6)  # halfway in ranks per core
    assert sync_at(8, two) == pytest.approx(4e-6 + 3 * 26e-6)
    only = SharedLink(alpha=20e-6, sync=4e-6, cores=2)  # crowded point unknown: scale
    assert sync_at(4, only) == pytest.approx(8e-6)
    noisy = SharedLink(alpha=20e-6, sync=5e-6, sync_crowded=3e-6, cores=2)
    assert sync_at(4, noisy) == 5e-6  # never cheaper than with a core each
    assert sync_at(4, SharedLink(alpha=20e-6, cores=2)) == 0.0


@pytest.mark.parametrize("p", [2, 4])
def test_direct_algorithms_count_their_syncs(p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every direct shared-memory algorithm's cost() pays (syncs per call) x the sync
    cost at its ranks per core: only the sync term moves when the sync cost does (round
    sizes held at half a slot: a round's fixed cost priced far above its work)."""
    from unison.algorithms import (
        all_gather_cma,
        all_gather_shm,
        all_reduce_shm,
        all_reduce_shm_one,
        broadcast_shm,
        reduce_scatter_shm,
        shm_arena,
    )
    from unison.link import SharedLink, sync_at

    monkeypatch.setattr(shm_arena, "round_fixed", lambda p, link, syncs=1: 1.0)

    half = 1 << 20
    cheap = SharedLink(alpha=20e-6, copy=1e-10, cma=2e-10, half=half, cores=2, sync=1e-6)
    dear = SharedLink(
        alpha=20e-6, copy=1e-10, cma=2e-10, half=half, cores=2, sync=5e-6, sync_crowded=50e-6
    )
    per_sync = sync_at(p, dear) - (1e-6 * max(1, p / 2))  # crowded: the old scale on cheap
    n = 4 * half  # 4 rounds of a half for the whole-buffer algorithms
    syncs = {
        all_reduce_shm: 2 * 4,  # reduce-scatter and all-gather phases: two per round
        all_reduce_shm_one: 4,
        broadcast_shm: 4,
        reduce_scatter_shm: 4,
        all_gather_shm: max(1, math.ceil(n / p / half)),  # rounds of one rank's block
        all_gather_cma: 2,  # addresses published, reads done
    }
    for mod, k in syncs.items():
        moved = mod.cost(p, n, dear) - mod.cost(p, n, cheap)
        assert moved == pytest.approx(k * per_sync), mod.NAME
    assert sync_at(4, dear) == 50e-6 and sync_at(2, dear) == 5e-6


def test_crowded_waits_price_messages_too_and_the_selector_weighs_syncs() -> None:
    """With ranks over cores a message step waits for a woken peer as a slot sync does:
    α carries the extra (``wake``), so a dear crowded sync does not hand small
    operations to the message algorithms; it does make the one-sync all-reduce win
    where the two-sync one saved copies."""
    from unison.algorithms.select import choose
    from unison.link import SharedLink, sync_at, wake

    def link(crowded: float) -> SharedLink:
        return SharedLink(
            alpha=20e-6, beta=1 / 7e9, gamma=1 / 20e9, copy=1 / 20e9, cores=2, sync=8e-6,
            sync_crowded=crowded,
        )  # fmt: skip

    dear = link(300e-6)
    assert wake(2, dear) == 0.0 and dear.at(1 << 20, 2) is dear
    assert wake(4, dear) == pytest.approx(sync_at(4, dear) - 8e-6)
    assert dear.at(1 << 20, 4).alpha == pytest.approx(20e-6 + 292e-6)
    plain = Link(alpha=20e-6)
    assert plain.at(1 << 20, 4) is plain  # no shared slots, no measured sync: as before
    n = 512 << 10
    assert choose("all_reduce", 4, n, link(9e-6), {}).name == "shm"  # copies decide
    assert choose("all_reduce", 4, n, dear, {}).name == "shm_one"  # one sync fewer
    for coll in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        for size in (8 << 10, 128 << 10, n):
            got = choose(coll, 4, size, dear, {}).name
            assert got.startswith("shm"), (coll, size, got)


def test_slot_path_prices_what_the_slots_do() -> None:
    """A call on the small-message slots is one round: one end's Python work and one
    barrier, then what each collective copies and reduces (all-gather: the gathered
    size; reduce-scatter: the whole input); ranks over cores queue their bytes."""
    from unison.algorithms import slot_path
    from unison.link import SharedLink

    c, g = 1e-10, 2e-10
    link = SharedLink(alpha=12e-6, hop=2e-6, copy=c, gamma=g, sync=3e-6, cores=2)
    n = 1 << 20
    for p, r in ((2, 1), (4, 2)):
        fixed = 3e-6 * r + (12e-6 - 2e-6) / 2  # the barrier (crowded: x r) and Python work
        assert slot_path.cost("all_reduce", p, n, link) == pytest.approx(
            fixed + r * n * (c + (p - 1) * g)
        )
        assert slot_path.cost("broadcast", p, n, link) == pytest.approx(fixed + r * n * c)
        assert slot_path.cost("all_gather", p, n, link) == pytest.approx(
            fixed + r * (n / p + n) * c
        )
        assert slot_path.cost("reduce_scatter", p, n, link) == pytest.approx(
            fixed + r * (n * c + (p - 1) / p * n * g)
        )
    assert math.isinf(slot_path.cost("all_reduce", 2, n, Link()))  # not one host's link
    assert math.isinf(slot_path.cost("all_to_all", 2, n, link))  # the slots do not carry it
    small = 1 << 20
    assert slot_path.uses_slots("all_reduce", 2, small, small)
    assert not slot_path.uses_slots("all_reduce", 2, small + 4, small)
    assert slot_path.uses_slots("all_gather", 4, 4 * small, small)  # a rank's block fits
    assert not slot_path.uses_slots("reduce_scatter", 4, 2 * small, small)  # the input must
    assert not slot_path.uses_slots("all_reduce", 2, 8, 0)  # UNISON_SMALL_BYTES=0: none


def test_rates_between_processes_replace_the_in_cache_ones() -> None:
    """Link.between_processes: copy, reduction (both regimes) and the round sync become
    the rates measured between processes, and a message's two copies follow; a link
    without them is unchanged."""
    from unison.link import shared_link

    cold = Link(alpha=20e-6, beta=3e-10, gamma=2e-10, copy=1.5e-10, xcopy=2e-10, xgamma=3e-10)
    base = Link(
        alpha=20e-6, beta=1e-10, gamma=5e-11, copy=4e-11, sync=30e-6, sync_crowded=90e-6,
        xcopy=6e-11, xgamma=9e-11, xsync=3e-6, big=8 << 20, cold=cold,
    )  # fmt: skip
    x = base.between_processes()
    assert (x.copy, x.gamma, x.sync, x.sync_crowded) == (6e-11, 9e-11, 3e-6, 90e-6)
    assert x.beta == pytest.approx(1e-10 + 2 * (6e-11 - 4e-11))
    assert x.cold is not None and (x.cold.copy, x.cold.gamma) == (2e-10, 3e-10)
    assert x.cold.beta == pytest.approx(3e-10 + 2 * (2e-10 - 1.5e-10))
    assert base.copy == 4e-11  # the selector's link is untouched
    shared = shared_link(x, slots=True)
    assert (shared.copy, shared.gamma, shared.sync) == (6e-11, 9e-11, 3e-6)
    hot = shared.cold
    assert hot is not None and (hot.warm_copy, hot.warm_gamma) == (6e-11, 9e-11)
    plain = Link(alpha=20e-6, copy=4e-11, sync=30e-6)
    assert plain.between_processes() == plain


@pytest.mark.timeout(60)
def test_validate_prices_slots_and_the_selectors_choice_between_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--validate`` on this host's cached model: calls that fit the slots are priced as
    slot calls, larger ones as the algorithm the selector picks on its own (in-cache)
    link, each at the rates measured between processes."""
    import dataclasses

    from unison import link as linkmodel
    from unison.algorithms import slot_path
    from unison.algorithms.select import choose
    from unison.simulate import shm_links
    from unison.transport import calibrate

    monkeypatch.setenv("UNISON_LINK_CACHE", str(tmp_path))
    monkeypatch.delenv("UNISON_SMALL_BYTES", raising=False)
    calibrate._memo.clear()
    cal = dataclasses.replace(
        calibrate.typical(), xcopy=1e-10, xgamma=2e-10, cold_xcopy=3e-10, cold_xgamma=4e-10,
        xsync=4e-6,
    )  # fmt: skip
    path = calibrate.cache_path()
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_json()))
    rows = [
        {"impl": "unison", "op": op, "np": 2, "size": n, "time_us": 1000.0}
        for op in ("all_reduce", "reduce_scatter")
        for n in (256 << 10, 16 << 20)
    ]
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"meta": {}, "rows": rows}))
    try:
        assert cli_main(["simulate", "--validate", str(f)]) == 0
        lines = capsys.readouterr().out.strip().splitlines()[1:]
        pick, link = shm_links()
        assert link.copy == 1e-10 and pick.copy == cal.copy  # in-cache for the choice
        got = {(ln.split()[0], ln.split()[2]): ln.split()[3] for ln in lines}
        assert got[("all_reduce", "256K")] == got[("reduce_scatter", "256K")] == "slots"
        rs = choose("reduce_scatter", 2, 16 << 20, pick, {})
        assert got[("reduce_scatter", "16M")] == rs.name
        small = slot_path.cost("reduce_scatter", 2, 256 << 10, link.at(256 << 10, 2))
        assert small > slot_path.cost("reduce_scatter", 2, 256 << 10, pick.at(256 << 10, 2))
        shown = [ln for ln in lines if ln.split()[:3] == ["reduce_scatter", "2", "256K"]]
        assert f"{small * 1e6:.1f} us" in shown[0]
        big = link.at(16 << 20, 2)
        want = big.overhead + rs.module.cost(2, 16 << 20, big)
        shown = [ln for ln in lines if ln.split()[:3] == ["reduce_scatter", "2", "16M"]]
        assert f"{want * 1e3:.2f} ms" in shown[0]
    finally:
        linkmodel.clear_measured()
        calibrate._memo.clear()


@pytest.mark.timeout(60)
def test_validate_prices_rows_of_several_hosts_on_their_two_level_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--hosts 2`` (hosts whose names do not tell them apart, as network namespaces):
    rows are priced on the two-level link of those hosts, never on the slots, with the
    algorithm the bench forced where it forced one."""
    from unison import link as linkmodel
    from unison.simulate import hosts_links, price

    n = 1 << 20
    rows = [{"impl": "unison", "op": "all_reduce", "np": 4, "size": n, "time_us": 900.0}]
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"meta": {"algo": "", "transport": "auto"}, "rows": rows}))
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps({"meta": {"algo": "all_reduce:ring"}, "rows": rows}))
    try:
        assert cli_main(["simulate", "--validate", str(one)]) == 0
        assert capsys.readouterr().out.splitlines()[1].split()[3] == "slots"  # one host
        assert cli_main(["simulate", "--validate", str(one), "--hosts", "2"]) == 0
        line = capsys.readouterr().out.splitlines()[1].split()
        pick, link = hosts_links(4, 2)
        assert isinstance(pick, TwoLevelLink) and (pick.hosts, pick.per_host) == (2, 2)
        algo, want = price("all_reduce", 4, n, pick, link, 0)
        shown = f"{want * 1e6:.1f} us" if want < 1e-3 else f"{want * 1e3:.2f} ms"
        assert line[3] == algo != "slots" and " ".join(line[4:6]) == shown
        assert cli_main(["simulate", "--validate", str(ring), "--hosts", "2"]) == 0
        assert capsys.readouterr().out.splitlines()[1].split()[3] == "ring"
    finally:
        linkmodel.clear_measured()
