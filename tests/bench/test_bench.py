"""unison bench: size parsing, the nccl-tests formulas, the table, and one real run."""

from __future__ import annotations

import json

import pytest

from unison.bench import bus_factor, parse_sizes
from unison.bench.backends import Case
from unison.bench.report import table
from unison.errors import InvalidArgumentError


def test_sizes() -> None:
    assert parse_sizes("8:64") == [8, 16, 32, 64]
    assert parse_sizes("1K:16K", 4) == [1024, 4096, 16384]
    assert parse_sizes("8,1M,2G") == [8, 1 << 20, 2 << 30]
    for bad in ("", "0:8", "64:8", "8:x", "1T"):
        with pytest.raises(InvalidArgumentError):
            parse_sizes(bad)


def test_bus_bandwidth_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("sendrecv", 2) == 1.0


def test_case_sizes_follow_nccl_tests() -> None:
    import numpy as np

    c = Case("all_gather", 1000, np.dtype(np.float32), 0, 3)
    assert (c.count, c.bufs["out"].size, c.bufs["inp"].size) == (999, 999, 333)
    c = Case("reduce_scatter", 1000, np.dtype(np.float32), 1, 4)
    assert (c.bufs["inp"].size, c.bufs["out"].size) == (1000, 250)


def test_table_ratios() -> None:
    rows = [
        {"impl": "unison", "op": "all_reduce", "size": 1024, "count": 256,
         "time_us": 10.0, "algbw": 1.0, "busbw": 2.0, "correct": True},
        {"impl": "gloo", "op": "all_reduce", "size": 1024, "count": 256,
         "time_us": 40.0, "algbw": 0.25, "busbw": 0.5, "correct": True},
        {"impl": "mpi", "op": "all_reduce", "size": 1024, "skipped": "unsupported"},
    ]  # fmt: skip
    text = table(rows, ["unison", "gloo", "mpi"], 2)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("1K"))
    assert "4.00" in line and "n/a" in line


@pytest.mark.timeout(120)
def test_bench_runs_checks_and_writes_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from unison.launch.cli import main

    out = tmp_path / "b.json"
    argv = ["bench", "-np", "2", "--ops", "all_reduce,all_gather,sendrecv,barrier", "--sizes",
            "8,64K", "--iters", "3", "--warmup", "1", "--compare", "nosuch"]  # fmt: skip
    assert main(argv) == 2  # a usage error, not a traceback
    assert main([*argv[:-2], "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = [r for r in data["rows"] if r["impl"] == "unison"]
    assert len(rows) == 7  # a barrier has no payload: one row, of size 0
    assert [(r["size"], r["count"]) for r in rows if r["op"] == "barrier"] == [(0, 0)]
    assert all(r["correct"] and r["time_us"] > 0 for r in rows)
    # what the timed calls cost the ranks besides the clock (getrusage, per call)
    assert all(r["cpu_us"] > 0 and r["vcsw"] >= 0 and r["ivcsw"] >= 0 for r in rows)
    assert data["meta"]["np"] == 2


@pytest.mark.timeout(120)
def test_barrier_rows_for_every_peer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from unison.bench.cli import missing
    from unison.launch.cli import main

    peers = [p for p in ("gloo", "mpi") if missing(p) is None]
    out = tmp_path / "b.json"
    argv = ["bench", "-np", "2", "--ops", "barrier", "--sizes", "8,1M", "--iters", "5",
            "--warmup", "1", "--json", str(out)]  # fmt: skip
    if peers:
        argv += ["--compare", ",".join(peers)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["impl"] for r in rows) == sorted(["unison", *peers])
    assert all(r["op"] == "barrier" and r["size"] == 0 and r["time_us"] > 0 for r in rows)


def test_list_form_cases_are_views_of_the_flat_buffers() -> None:
    import numpy as np

    c = Case("all_gather_list", 1000, np.dtype(np.float32), 0, 4)
    assert (c.count, len(c.blocks)) == (1000, 4)
    assert all(np.shares_memory(b, c.bufs["out"]) and b.size == 250 for b in c.blocks)
    c = Case("reduce_scatter_list", 1000, np.dtype(np.float32), 1, 4)
    assert all(np.shares_memory(b, c.bufs["inp"]) and b.size == 250 for b in c.blocks)
    assert bus_factor("all_gather_list", 4) == bus_factor("all_gather", 4)


@pytest.mark.timeout(120)
def test_list_forms_are_rows_named_in_ops_not_in_all(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from unison.bench import OPS
    from unison.launch.cli import main

    assert "all_gather_list" not in OPS  # `--ops all` keeps the tensor forms only
    out = tmp_path / "b.json"
    argv = ["bench", "-np", "2", "--ops", "all_gather_list,reduce_scatter_list", "--sizes",
            "8,64K", "--iters", "3", "--warmup", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "unison"]
    assert sorted((r["op"], r["size"]) for r in rows) == [
        ("all_gather_list", 8),
        ("all_gather_list", 65536),
        ("reduce_scatter_list", 8),
        ("reduce_scatter_list", 65536),
    ]
    assert all(r["correct"] and r["time_us"] > 0 for r in rows)
