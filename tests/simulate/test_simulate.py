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
    other): only the first round's copy in adds to the copies out; all-gathers pay
    the copy of the own block into the output (every algorithm alike)."""
    from unison.algorithms import all_gather_ring, all_gather_shm, broadcast_shm
    from unison.link import SharedLink

    link = SharedLink(alpha=1e-6, beta=1e-9, copy=1e-10, half=1 << 20, sync=1e-6, cores=2)
    one = broadcast_shm.cost(2, 1 << 20, link)
    assert one == pytest.approx(1e-6 + 2 * (1 << 20) * 1e-10)  # one round: in, then out
    many = broadcast_shm.cost(2, 16 << 20, link)
    assert many == pytest.approx(16 * 1e-6 + (17 << 20) * 1e-10)  # 16 rounds overlapped
    crowded = broadcast_shm.cost(4, 16 << 20, link)  # 4 copies per round on 2 cores
    assert crowded == pytest.approx(16 * 2e-6 + (33 << 20) * 1e-10)  # sync x ranks/core
    n = 8 << 20
    own = all_gather_ring.own_copy(2, n, link)
    assert own == pytest.approx(n / 2 * 1e-10)
    assert all_gather_shm.cost(2, n, link) == pytest.approx(
        1e-6 * 4 + n * 1e-10 + own
    )  # each rank's 4 MiB part in 4 rounds of a 1 MiB half
