"""Pure logic in one process: negotiation, response cache, fusion, stall inspector,
timeline file, settings aliases."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from unison.horovod.cache import ResponseCache, and_bits, bits_to_ids, ids_to_bits
from unison.horovod.fusion import ALONE_BYTES, plan
from unison.horovod.negotiation import (
    Coordinator,
    HvdOp,
    RequestKind,
    Response,
    TensorRequest,
    reducescatter_rows,
    request_of,
)
from unison.horovod.settings import load_settings
from unison.horovod.stall import StallInspector
from unison.horovod.timeline import Timeline


def ar(
    name: str,
    shape: tuple[int, ...] = (4,),
    dtype: str = "torch.float32",
    op: int = 0,
    **kw: object,
) -> TensorRequest:
    return TensorRequest(name, RequestKind.ALLREDUCE, dtype, (shape,), op, **kw)  # type: ignore[arg-type]


def test_coordinator_waits_for_every_rank_and_keeps_arrival_order() -> None:
    c = Coordinator(3)
    c.add(1, [ar("b"), ar("a")])
    c.add(0, [ar("a")])
    assert c.ready() == []
    assert c.missing("a") == [2] and c.missing("b") == [0, 2]
    c.add(2, [ar("a"), ar("b")])
    c.add(0, [ar("b")])
    names = [r.name for r in c.ready()]
    assert names == ["b", "a"]
    assert not c.busy


@pytest.mark.parametrize(
    ("other", "word"),
    [
        (ar("t", (5,)), "shape"),
        (ar("t", dtype="torch.float64"), "dtype"),
        (ar("t", op=int(HvdOp.SUM)), "reduce op"),
        (ar("t", prescale=2.0), "scale"),
        (TensorRequest("t", RequestKind.BROADCAST, "torch.float32", ((4,),), root=1), "operation"),
    ],
)
def test_mismatch_becomes_one_error_response(other: TensorRequest, word: str) -> None:
    c = Coordinator(2)
    c.add(0, [ar("t")])
    c.add(1, [other])
    (resp,) = c.ready()
    assert resp.error and word in resp.error and "'t'" in resp.error
    assert "rank 0" in resp.error and "rank 1" in resp.error


def test_broadcast_root_mismatch() -> None:
    c = Coordinator(2)
    c.add(0, [TensorRequest("x", RequestKind.BROADCAST, "torch.int32", ((3,),), root=0)])
    c.add(1, [TensorRequest("x", RequestKind.BROADCAST, "torch.int32", ((3,),), root=1)])
    (resp,) = c.ready()
    assert "root rank" in resp.error


def test_allgather_first_dims_may_differ_and_are_recorded() -> None:
    c = Coordinator(3)
    for r in range(3):
        c.add(r, [TensorRequest("g", RequestKind.ALLGATHER, "torch.int64", ((r + 1, 2),))])
    (resp,) = c.ready()
    assert not resp.error and resp.per_rank == ((1,), (2,), (3,))
    assert request_of(resp, 2).shapes == ((3, 2),)
    c.add(0, [TensorRequest("h", RequestKind.ALLGATHER, "torch.int64", ((1, 2),))])
    c.add(1, [TensorRequest("h", RequestKind.ALLGATHER, "torch.int64", ((1, 3),))])
    c.add(2, [TensorRequest("h", RequestKind.ALLGATHER, "torch.int64", ((1, 2),))])
    assert "shape" in c.ready()[0].error


def test_join_counts_joined_ranks_as_ready_and_reports_the_last() -> None:
    c = Coordinator(3)
    c.add(2, [TensorRequest("__join__", RequestKind.JOIN)])
    c.add(0, [ar("x")])
    assert c.ready() == []
    c.add(1, [ar("x")])
    (resp,) = c.ready()
    assert resp.joined == (2,) and not resp.cacheable
    c.add(0, [TensorRequest("__join__", RequestKind.JOIN)])
    c.add(1, [TensorRequest("__join__", RequestKind.JOIN)])
    (j,) = c.ready()
    assert j.request.kind is RequestKind.JOIN and j.value == 1


def test_forced_error_fails_a_stalled_name() -> None:
    c = Coordinator(2)
    c.add(0, [ar("s")])
    (resp,) = c.ready({"s": "stalled"})
    assert resp.error == "stalled" and not c.busy


def test_reducescatter_rows() -> None:
    assert reducescatter_rows(10, 4) == [3, 3, 2, 2]
    assert reducescatter_rows(2, 3) == [1, 1, 0]


def test_cache_ids_agree_given_the_same_history_and_evict_lru() -> None:
    a, b = ResponseCache(2), ResponseCache(2)
    for cache in (a, b):
        cache.put(Response(ar("x")))
        cache.put(Response(ar("y")))
        cache.touch(Response(ar("x")))
        cache.put(Response(ar("x")))  # refresh: x most recent
        cache.put(Response(ar("z")))  # evicts y
    assert a.lookup(ar("y"), 0) is None
    assert a.lookup(ar("x"), 0) == b.lookup(ar("x"), 0) is not None
    assert a.lookup(ar("z"), 1) == b.lookup(ar("z"), 1) == 1  # y's freed id reused
    assert a.lookup(ar("x", (5,)), 0) is None  # same name, other shape: miss
    assert len(a) == 2


def test_cache_matches_rank_specific_parts() -> None:
    c = ResponseCache(4)
    g = TensorRequest("g", RequestKind.ALLGATHER, "torch.float32", ((2, 3),))
    c.put(Response(g, per_rank=((2,), (5,))))
    assert c.lookup(g, 0) == 0
    assert c.lookup(g, 1) is None
    assert c.lookup(TensorRequest("g", RequestKind.ALLGATHER, "torch.float32", ((5, 3),)), 1) == 0


def test_errors_and_joins_are_not_cached() -> None:
    c = ResponseCache(4)
    c.put(Response(ar("e"), error="bad"))
    c.put(Response(ar("j"), joined=(1,)))
    assert len(c) == 0
    assert ResponseCache(0).lookup(ar("x"), 0) is None


def test_bit_vectors() -> None:
    assert bits_to_ids(ids_to_bits({0, 3, 9, 17})) == [0, 3, 9, 17]
    assert bits_to_ids(
        and_bits([ids_to_bits({1, 2, 9}), ids_to_bits({2, 9}), ids_to_bits({2, 9, 30})])
    ) == [2, 9]
    assert and_bits([b"", ids_to_bits({1})]) == b""


def test_fusion_plan_groups_compatible_neighbours_up_to_the_threshold() -> None:
    rs = [
        Response(ar("a")),
        Response(ar("b")),
        Response(ar("c", dtype="torch.float64")),
        Response(ar("d", dtype="torch.float64")),
        Response(ar("e", op=int(HvdOp.ADASUM))),
        Response(ar("f")),
        Response(ar("g", prescale=0.5)),
        Response(TensorRequest("h", RequestKind.BROADCAST, "torch.float32", ((4,),), root=0)),
    ]
    assert plan(rs, [16] * 8, 1 << 20) == [[0, 1], [2, 3], [4], [5], [6], [7]]
    assert plan(rs[:2], [16, 16], 20) == [[0], [1]]
    assert plan([Response(ar(str(i))) for i in range(5)], [10] * 5, 30) == [[0, 1, 2], [3, 4]]
    assert plan([], [], 10) == []
    # a tensor of ALONE_BYTES or more is reduced in place, never packed with its neighbours
    big = ALONE_BYTES
    five = [Response(ar(str(i))) for i in range(5)]
    assert plan(five, [16, big, 16, 16, big - 1], 1 << 30) == [[0], [1], [2, 3, 4]]


def test_stall_inspector_warns_once_per_interval_and_names_missing_ranks() -> None:
    s = StallInspector(3, warn_after=10, shutdown_after=30)
    holders = {"w": {0, 2}, "ok": {0, 1, 2}}
    s.observe(holders, 100.0)
    assert s.check(holders, 105.0) == ([], [])
    warn, kill = s.check(holders, 111.0)
    assert [w.name for w in warn] == ["w"] and warn[0].missing == (1,) and not kill
    assert "missing on ranks [1]" in warn[0].describe()
    assert s.check(holders, 115.0) == ([], [])
    assert [k.name for k in s.check(holders, 131.0)[1]] == ["w"]
    s.observe({}, 132.0)
    assert s.next_due(133.0) is None
    assert StallInspector(2, enabled=False).check(holders, 1e9) == ([], [])


def test_timeline_writes_valid_chrome_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tl.json"
    tl = Timeline(str(path), mark_cycles=True)
    tl.span("grad.w", "NEGOTIATE_ALLREDUCE", 1.0, 1.5)
    tl.span("grad.w", "ALLREDUCE", 1.5, 1.7, fused=2)
    tl.cycle(1.0)
    tl.close()
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert {e["name"] for e in events} >= {
        "thread_name",
        "NEGOTIATE_ALLREDUCE",
        "ALLREDUCE",
        "CYCLE_START",
    }
    x = [e for e in events if e["ph"] == "X"]
    assert x[0]["dur"] == pytest.approx(5e5)


def test_horovod_variables_are_aliases() -> None:
    s = load_settings(
        env={
            "HOROVOD_FUSION_THRESHOLD": "1024",
            "HOROVOD_CYCLE_TIME": "5",
            "HOROVOD_TIMELINE": "/tmp/x.json",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "7",
            "HOROVOD_CACHE_CAPACITY": "0",
        }
    )
    assert (s.fusion_threshold, s.cycle_time, s.timeline, s.stall_check_time, s.cache_capacity) == (
        1024,
        0.005,
        "/tmp/x.json",
        7.0,
        0,
    )
    s2 = load_settings(env={"HOROVOD_FUSION_THRESHOLD": "1024", "UNISON_FUSION_THRESHOLD": "4K"})
    assert s2.fusion_threshold == 4096
    assert load_settings(env={}).stall_check_time == 60.0


def test_capability_queries_before_init_are_horovods() -> None:
    pytest.importorskip("torch")
    import unison.torch as hvd

    if hvd.is_initialized():
        pytest.skip("initialized by another test in this process")
    # nothing is enabled before init(); what is built is what this environment can import
    assert hvd.mpi_enabled() is False and hvd.gloo_enabled() is False
    assert isinstance(hvd.mpi_built(), bool) and isinstance(hvd.gloo_built(), bool)
    assert hvd.nccl_built() == 0
    with pytest.raises(ValueError, match="Horovod MPI is not enabled"):
        hvd.mpi_threads_supported()


def test_cycle_records_round_trip_and_refuse_what_does_not_fit() -> None:
    import numpy as np

    from unison.horovod import record

    cache = ResponseCache(64)
    for i in range(20):
        cache.put(Response(ar(f"t{i}")))
    ids = [0, 3, 17]
    bits = ids_to_bits(ids)
    parts = {"t3": b"\x01\x02\x03\x04", "t17": bytes(range(40))}
    rec = np.zeros(record.RECORD_BYTES, np.uint8)
    for steady in (True, False):
        msg = ("C", 7, bits, [], {}, parts, steady)
        assert record.encode(msg, cache, rec)
        flags, back = record.decode(rec, 7, cache)
        assert back == msg and bool(flags & record.STEADY) == steady
    # a record of another cycle is an error, never a silent decision
    with pytest.raises(ValueError, match="cycle 7"):
        record.decode(rec, 8, cache)
    # new requests, stall shutdowns, an uncached inline part or too many bytes do not fit
    assert not record.encode(("C", 1, bits, [ar("new")], {}, {}, False), cache, rec)
    assert not record.encode(("C", 1, bits, [], {"t0": "stalled"}, {}, False), cache, rec)
    assert not record.encode(("C", 1, bits, [], {}, {"nope": b"x"}, False), cache, rec)
    big = {"t1": bytes(record.RECORD_BYTES)}
    assert not record.encode(("C", 1, bits, [], {}, big, False), cache, rec)
    # markers carry no message
    for flag in (record.P2P, record.BYE):
        record.marker(rec, 9, flag)
        flags, back = record.decode(rec, 9, cache)
        assert back is None and flags & flag
