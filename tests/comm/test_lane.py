"""The blocking small-collective lane (unison/backends/native/lane.py).

One job per transport checks every small collective three ways against the numpy
oracle: blocking (the lane, on shared memory), ``async_op=True`` (the executor's
slot path) and on a group past the slot regions (the general algorithms): the
lane must give the same bytes as both, for every op and dtype, and must run no
Work at all; the list forms of all_gather and reduce_scatter take the lane too and
give the tensor forms' bytes. Its failures: ranks that disagree (op, dtype, count, root; also with
a peer on the general path) get a MismatchError on every rank, a silent peer a
CollectiveTimeoutError naming it; a dead peer is covered by
tests/transport/test_seqslot.py (the world's blocking all_reduce takes the lane).
"""

from __future__ import annotations

import numpy as np
import pytest

import unison as un
from unison import ReduceOp
from unison.backends.native.executor import Executor
from unison.buffers import check_op, from_numpy
from unison.config import load_config
from unison.errors import InvalidArgumentError, UnisonError
from unison.testing import reduce_oracle, spawn
from unison.world import current

pytestmark = pytest.mark.timeout(180)

DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_)


def _ok(op: ReduceOp, dtype: type) -> bool:
    dt = from_numpy(np.dtype(dtype))
    assert dt is not None
    try:
        check_op(op, dt)
    except UnisonError:
        return False
    return True


def _inp(case: int, q: int, n: int, dtype: type, exact: bool) -> np.ndarray:
    """Rank ``q``'s input; ``exact``: small values every reduction order agrees on."""
    rng = np.random.default_rng([case, q])
    if dtype is np.bool_:
        return rng.random(n) < 0.5
    if exact or not np.issubdtype(dtype, np.floating):
        return rng.integers(1, 4, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _three_ways() -> list[str]:
    r, p = un.rank(), un.size()
    rt = current()
    n_slots = rt.config.group_slots  # UNISON_GROUP_SLOTS
    groups = [un.new_group(range(p)) for _ in range(n_slots)]
    general = groups[-1]  # id n_slots: no slot region, the general algorithms
    assert general.id >= n_slots
    shared = rt.executors[0].slots is not None  # type: ignore[attr-defined]
    submitted = []
    real_submit = Executor.submit

    def counting(self: Executor, *a: object, **kw: object) -> object:
        submitted.append(self.id)
        return real_submit(self, *a, **kw)  # type: ignore[arg-type]

    Executor.submit = counting  # type: ignore[method-assign]
    bad: list[str] = []
    case = 0
    calls = [0]

    reduces = [0]  # the all_reduce calls among them

    def three(what: str, run: object, make: object, exact: bool) -> None:
        """run(bufs, group, async_op) on fresh buffers three ways; compare bytes."""
        calls[0] += 1
        reduces[0] += what.startswith("all_reduce ")
        outs = []
        for group, async_op in ((None, False), (None, True), (general, False)):
            bufs = make()  # type: ignore[operator]
            w = run(bufs, group, async_op)  # type: ignore[operator]
            if w is not None:
                w.wait()
            outs.append(bufs[0])
        lane, slot_path, algo = outs
        if not _same(lane, slot_path):
            bad.append(f"{what}: lane and async slot path differ")
        if exact and not _same(lane, algo):
            bad.append(f"{what}: lane and general path differ")
        if not exact and not np.allclose(lane, algo, rtol=1e-2, atol=1e-2):
            bad.append(f"{what}: lane and general path disagree")
        outs_oracle.append((what, lane))

    for dtype in DTYPES:
        for n in (1, 3, 1000 // np.dtype(dtype).itemsize):
            for op in ReduceOp:
                if not _ok(op, dtype):
                    continue
                case += 1
                ins = [_inp(case, q, n, dtype, op is ReduceOp.PRODUCT) for q in range(p)]
                want = reduce_oracle(ins, op)
                # a float sum's rounding depends on the order: the general path's
                # reduce_scatter algorithm sums each block in its own order, the slots
                # (like the direct shared-memory algorithms) in rank order
                exact = op not in (ReduceOp.SUM, ReduceOp.AVG) or not np.issubdtype(
                    dtype, np.floating
                )
                outs_oracle: list[tuple[str, np.ndarray]] = []
                three(
                    f"all_reduce {op.name} {np.dtype(dtype)} n={n}",
                    lambda b, g, a, op=op: un.all_reduce(b[0], op=op, group=g, async_op=a),
                    lambda ins=ins: [ins[r].copy()],
                    True,  # rank order on every path: the same bytes
                )
                rs = [_inp(case + 7, q, n * p, dtype, op is ReduceOp.PRODUCT) for q in range(p)]
                three(
                    f"reduce_scatter {op.name} {np.dtype(dtype)} n={n}",
                    lambda b, g, a, op=op: un.reduce_scatter_tensor(
                        b[0], b[1], op=op, group=g, async_op=a
                    ),
                    lambda rs=rs, n=n, dtype=dtype: [np.empty(n, dtype), rs[r]],
                    exact,
                )
                three(  # the list form: one input block per rank
                    f"reduce_scatter list {op.name} {np.dtype(dtype)} n={n}",
                    lambda b, g, a, op=op: un.reduce_scatter(
                        b[0], np.split(b[1], p), op=op, group=g, async_op=a
                    ),
                    lambda rs=rs, n=n, dtype=dtype: [np.empty(n, dtype), rs[r]],
                    exact,
                )
                (_, got), (_, got_rs), (_, got_rs_list) = outs_oracle
                if not _same(got_rs_list, got_rs):
                    bad.append(f"reduce_scatter {op.name} {np.dtype(dtype)} n={n}: list form")
                if op is ReduceOp.AVG and np.issubdtype(dtype, np.floating):
                    ok = np.allclose(got, want, rtol=1e-2, atol=1e-2)
                else:
                    ok = np.array_equal(got, want)
                    ok = ok and np.array_equal(got_rs, reduce_oracle(rs, op)[r * n : (r + 1) * n])
                if not ok:
                    bad.append(f"{op.name} {np.dtype(dtype)} n={n}: not the oracle's result")
            case += 1
            ins = [_inp(case, q, n, dtype, False) for q in range(p)]
            outs_oracle = []
            for root in range(p):
                three(
                    f"broadcast root={root} {np.dtype(dtype)} n={n}",
                    lambda b, g, a, root=root: un.broadcast(b[0], root, group=g, async_op=a),
                    lambda ins=ins, root=root: [
                        ins[r].copy() if r == root else np.zeros_like(ins[r])
                    ],
                    True,
                )
            three(
                f"all_gather {np.dtype(dtype)} n={n}",
                lambda b, g, a: un.all_gather_into_tensor(b[0], b[1], group=g, async_op=a),
                lambda ins=ins, n=n, dtype=dtype: [np.empty(n * p, dtype), ins[r]],
                True,
            )
            three(  # the list form: one output block per rank
                f"all_gather list {np.dtype(dtype)} n={n}",
                lambda b, g, a: un.all_gather(np.split(b[0], p), b[1], group=g, async_op=a),
                lambda ins=ins, n=n, dtype=dtype: [np.empty(n * p, dtype), ins[r]],
                True,
            )
            if not _same(outs_oracle[p + 1][1], outs_oracle[p][1]):
                bad.append(f"all_gather {np.dtype(dtype)} n={n}: list form")
            for root in range(p):
                if not _same(outs_oracle[root][1], ins[root]):
                    bad.append(f"broadcast root={root} {np.dtype(dtype)}: not rank {root}'s data")
            if not _same(outs_oracle[p][1], np.concatenate(ins)):
                bad.append(f"all_gather {np.dtype(dtype)} n={n}: not every rank's data")
    Executor.submit = real_submit  # type: ignore[method-assign]
    # on shared memory the blocking world calls ran no Work (only the async ones were
    # submitted); on TCP there are no slots and every call was, but the blocking
    # all-reduces, which a group without slots runs in the caller's thread
    # (message_calls.py), as does the group past the slot regions
    world = submitted.count(0)
    if world != (calls[0] if shared else 2 * calls[0] - reduces[0]):
        bad.append(f"{world} world submissions for {calls[0]} blocking + async pairs")
    if submitted.count(general.id) != calls[0] - reduces[0]:
        bad.append("the general group's calls other than all_reduce did not all take a Work")
    Executor.submit = counting  # type: ignore[method-assign]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:  # torch CPU tensors (bfloat16 too) take the lane after validation
        for tdt in (torch.float32, torch.bfloat16, torch.int64):  # (by message without slots)
            t = torch.arange(5, dtype=tdt) + r
            before = len(submitted)
            un.all_reduce(t)
            want = sum(torch.arange(5, dtype=tdt) + q for q in range(p))
            if not torch.equal(t, want):
                bad.append(f"torch {tdt} all_reduce: {t} != {want}")
            if len(submitted) != before:
                bad.append(f"torch {tdt} all_reduce took a Work")
    Executor.submit = real_submit  # type: ignore[method-assign]
    # a rank on the executor's path (async) meets peers on the lane in the same slots
    for i in range(20):
        x = np.full(4, r + i, np.float64)
        if r == i % p:
            un.all_reduce(x, async_op=True).wait()
        else:
            un.all_reduce(x)
        if not np.array_equal(x, np.full(4, sum(q + i for q in range(p)), np.float64)):
            bad.append(f"mixed paths, call {i}: {x}")
    # one count in several shapes (the lane's plans are per shape), 0-d arrays too
    for shape in ((6,), (2, 3), (3, 2), (1, 6), (6, 1), (), (1,)):
        base = (np.arange(int(np.prod(shape))) + 1).reshape(shape)
        x = np.array(base * (r + 1), np.int64)  # 0-d stays an array
        un.all_reduce(x)
        if x.shape != shape or not np.array_equal(x, base * (p * (p + 1) // 2)):
            bad.append(f"all_reduce of shape {shape}: {x!r}")
        y = np.array(base * (r + 1), np.float32)
        un.broadcast(y, p - 1)
        if y.shape != shape or not np.array_equal(y, base * p):
            bad.append(f"broadcast of shape {shape}: {y!r}")
        got = np.empty((p, *shape), np.float32)
        un.all_gather_into_tensor(got, np.array(base * (r + 1), np.float32))
        if not np.array_equal(got, np.stack([base * (q + 1) for q in range(p)])):
            bad.append(f"all_gather of shape {shape}: {got!r}")
        out = np.empty(shape, np.int64)
        whole = np.concatenate([base.reshape(-1) * (q + 1) for q in range(p)]) + r
        un.reduce_scatter_tensor(out, whole.astype(np.int64))
        want = sum(
            np.concatenate([base.reshape(-1) * (q + 1) for q in range(p)]) + q for q in range(p)
        )
        n = base.size
        if out.shape != shape or not np.array_equal(out.reshape(-1), want[r * n : (r + 1) * n]):
            bad.append(f"reduce_scatter of shape {shape}: {out!r}")
    # a sub-group with a slot region takes the lane too
    x = np.full(3, r + 1, np.int64)
    before = len(submitted)
    Executor.submit = counting  # type: ignore[method-assign]
    un.all_reduce(x, group=groups[1])
    Executor.submit = real_submit  # type: ignore[method-assign]
    if not np.array_equal(x, np.full(3, p * (p + 1) // 2)):
        bad.append("sub-group all_reduce")
    if shared and len(submitted) != before:
        bad.append("the sub-group's blocking all_reduce did not take the lane")
    return bad


@pytest.mark.parametrize(
    ("transport", "np_"),
    [("auto", 3), ("tcp", 2)],
)
def test_lane_matches_slot_path_general_path_and_oracle(transport: str, np_: int) -> None:
    # 3 slot regions (the world and sub-groups 1, 2): the fourth group (id 3) has none
    env = {"UNISON_TRANSPORT": transport, "UNISON_TIMEOUT": "60", "UNISON_GROUP_SLOTS": "3"}
    for bad in spawn(_three_ways, np_, env=env, timeout=170):
        assert bad == []


@pytest.mark.parametrize("bad", ["0", "-1", "4097", "x"])
def test_group_slots_knob_is_validated(bad: str) -> None:
    assert load_config({"UNISON_GROUP_SLOTS": "5"}).group_slots == 5
    with pytest.raises(InvalidArgumentError, match="UNISON_GROUP_SLOTS"):
        load_config({"UNISON_GROUP_SLOTS": bad})


def _mismatches() -> list[str]:
    """Each disagreement on its own group (a failed group refuses later calls)."""
    r, p = un.rank(), un.size()
    f32 = np.float32
    cases = {
        "count": lambda g: un.all_reduce(np.ones(2 + (r == 1), f32), group=g),
        "dtype": lambda g: un.all_reduce(np.ones(2, f32 if r else np.int32), group=g),
        "reduce op": lambda g: un.all_reduce(
            np.ones(2, f32), op=ReduceOp.MAX if r == 2 else ReduceOp.SUM, group=g
        ),
        "collective": lambda g: (
            un.all_reduce(np.ones(2, f32), group=g) if r else un.broadcast(np.ones(2, f32), 0, g)
        ),
        "root": lambda g: un.broadcast(np.ones(2, f32), src=1 if r == 1 else 0, group=g),
        # rank 0's 16 KiB take the general path (frames), the others' 8 B the lane
        "path": lambda g: un.all_reduce(np.ones(4096 if r == 0 else 2, f32), group=g),
    }
    groups = [un.new_group(range(p)) for _ in cases]
    assert groups[-1].id < current().config.group_slots
    bad = []
    for (name, fn), g in zip(cases.items(), groups, strict=True):
        try:
            fn(g)
            bad.append(f"{name}: no error on rank {r}")
        except un.MismatchError as exc:
            if "mismatch" not in str(exc) or not any(f"rank {q}" in str(exc) for q in range(p)):
                bad.append(f"{name}: unclear error on rank {r}: {exc}")
        except un.CommunicationError as exc:
            bad.append(f"{name}: rank {r} got {type(exc).__name__}: {exc}")
        with pytest.raises(un.CommunicationError):
            un.barrier(group=g)  # the group is broken now: refused, never hung
    x = np.ones(2, f32)
    un.all_reduce(x)  # the world was not involved: it still works
    if not np.array_equal(x, np.full(2, p, f32)):
        bad.append("world all_reduce after the mismatches")
    return bad


def test_lane_mismatches_fail_every_rank_with_a_mismatch_error() -> None:
    for bad in spawn(_mismatches, 3, env={"UNISON_TIMEOUT": "30"}, timeout=120):
        assert bad == []
