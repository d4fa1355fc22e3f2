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
