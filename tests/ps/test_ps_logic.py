"""Parameter-server logic in one process: policies, placement, rules, server state."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

import unison.ps as ps
from unison.errors import InvalidArgumentError
from unison.ps.consistency import DONE, from_key
from unison.ps.state import ServerState, WorkerRequest
from unison.ps.wire import PsOp, PsStatus

pytestmark = pytest.mark.timeout(30)


# --- policies -----------------------------------------------------------------------------
def test_ssp0_is_bsp_and_gating_table() -> None:
    assert ps.SSP(0) == ps.BSP() and hash(ps.SSP(0)) == hash(ps.BSP())
    assert ps.SSP(1) != ps.BSP() and ps.ASP() != ps.SSP(0)
    for clock in range(6):
        for slowest in [*range(6), DONE]:
            for s in range(4):
                pol = ps.SSP(s)
                assert pol.pull_ready(clock, slowest) == (slowest >= clock - s)
                # staleness 0 holds a clock's pushes until every worker finished it
                assert pol.apply_ready(clock, slowest) == (s > 0 or slowest > clock)
                assert ps.BSP().pull_ready(clock, slowest) == ps.SSP(0).pull_ready(clock, slowest)
            assert ps.ASP().pull_ready(clock, slowest) and ps.ASP().apply_ready(clock, slowest)
    for pol in (ps.BSP(), ps.SSP(3), ps.ASP()):
        assert from_key(pol.key()) == pol
    with pytest.raises(InvalidArgumentError):
        ps.SSP(-1)


# --- placement ----------------------------------------------------------------------------
def test_layout_is_deterministic_and_splits_big_keys() -> None:
    small = ps.layout("bias", 10, 4, 3, 1024)
    assert len(small) == 1 and small[0].server == ps.home("bias", 3)
    big = ps.layout("weights", 1001, 4, 3, 1024)
    assert sorted(p.server for p in big) == [0, 1, 2]
    assert big[0].start == 0 and big[-1].stop == 1001
    assert all(a.stop == b.start for a, b in itertools.pairwise(big))
    assert max(p.count for p in big) - min(p.count for p in big) <= 1
    assert big == ps.layout("weights", 1001, 4, 3, 1024)
    assert len(ps.layout("weights", 1001, 4, 1, 1)) == 1  # one server: never split


# --- rules against torch.optim --------------------------------------------------------------
def _torch_steps(opt_name: str, grads: list[np.ndarray], p0: np.ndarray, **kw: float) -> np.ndarray:
    torch = pytest.importorskip("torch")
    p = torch.tensor(p0.copy(), requires_grad=True)
    opt = getattr(torch.optim, opt_name)([p], **kw)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy()


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_matches_torch(nesterov: bool) -> None:
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(50)
    grads = [rng.standard_normal(50) for _ in range(7)]
    rule = ps.SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    p, state = p0.copy(), {}
    for g in grads:
        rule.apply("k", p, g, state)
    want = _torch_steps(
        "SGD", grads, p0, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=nesterov
    )
    np.testing.assert_allclose(p, want, rtol=1e-12, atol=1e-12)


def test_adam_matches_torch() -> None:
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(40)
    grads = [rng.standard_normal(40) for _ in range(9)]
    rule = ps.Adam(lr=0.01, weight_decay=0.1)
    p, state = p0.copy(), {}
    for g in grads:
        rule.apply("k", p, g, state)
    np.testing.assert_allclose(
        p, _torch_steps("Adam", grads, p0, lr=0.01, weight_decay=0.1), rtol=1e-10, atol=1e-12
    )


def test_rules_check_dtypes_and_arguments() -> None:
    assert ps.SGD(lr=0.1).check(np.dtype(np.int32)) is not None
    assert ps.Sum().check(np.dtype(np.int32)) is None
    bads = (lambda: ps.SGD(lr=0), lambda: ps.SGD(lr=0.1, momentum=1.0), lambda: ps.Adam(beta1=1))
    for bad in bads:
        with pytest.raises(InvalidArgumentError):
            bad()


# --- server state -------------------------------------------------------------------------
W = (0, 1, 2)


def _state(policy: ps.Consistency) -> ServerState:
    st = ServerState(0, 9, W, policy, park_timeout=5.0)
    st.handle(
        WorkerRequest(0, PsOp.CLAIM, 1, 0, {"keys": [{"k": "x", "shape": [4], "dtype": "<f8"}]})
    )
    st.handle(
        WorkerRequest(
            0,
            PsOp.INIT,
            2,
            0,
            {"pieces": [{"k": "x", "p": 0, "start": 0, "stop": 4, "shape": [4]}]},
            [np.zeros(4)],
        )
    )
    st.handle(WorkerRequest(0, PsOp.COMMIT, 3, 0, {"keys": ["x"]}))
    return st


def _push(st: ServerState, w: int, clock: int, value: float) -> list:
    return st.handle(
        WorkerRequest(w, PsOp.PUSH, 10, clock, {"pieces": [["x", 0]]}, [np.full(4, value)])
    )


def _pull(st: ServerState, w: int, clock: int) -> list:
    return st.handle(WorkerRequest(w, PsOp.PULL, 20 + w, clock, {"pieces": [["x", 0]]}))


def test_bsp_holds_a_clocks_pushes_until_every_worker_finished_it() -> None:
    st = _state(ps.BSP())
    _push(st, 0, 0, 1.0)
    _push(st, 1, 0, 2.0)
    assert st.shards[("x", 0)][0] == 0.0  # held: worker 2 has not finished clock 0
    for w in W:
        st.handle(WorkerRequest(w, PsOp.CLOCK, 0, 1))
    assert st.shards[("x", 0)][0] == 3.0  # default rule Assign: the sum of the clock
    _push(st, 0, 1, 5.0)  # worker 0 runs on at clock 1
    (reply,) = _pull(st, 1, 1)  # a pull at clock 1 sees exactly clock 0
    assert reply.arrays[0][0] == 3.0


def test_ssp_parks_a_pull_too_far_ahead_and_serves_it_when_clocks_move() -> None:
    st = _state(ps.SSP(2))
    st.handle(
        WorkerRequest(0, PsOp.RULE, 4, 0, {}, [np.frombuffer(pickle.dumps(ps.Sum()), np.uint8)])
    )
    for c in range(1, 4):
        st.handle(WorkerRequest(0, PsOp.CLOCK, 0, c))
        st.handle(WorkerRequest(1, PsOp.CLOCK, 0, c))
    assert _pull(st, 0, 3) == []  # worker 2 at clock 0 < 3 - 2
    assert st.blockers(3) == [2]
    _push(st, 0, 3, 1.0)  # eager under SSP(2)
    assert st.shards[("x", 0)][0] == 1.0
    (reply,) = st.handle(WorkerRequest(2, PsOp.CLOCK, 0, 1))
    assert reply.worker == 0 and reply.status is PsStatus.OK and reply.arrays[0][0] == 1.0


def test_parked_pull_expires_naming_the_straggler() -> None:
    now = [0.0]
    st = ServerState(0, 9, W, ps.BSP(), park_timeout=5.0, now=lambda: now[0])
    st.shards[("x", 0)] = np.zeros(2)
    st.info[("x", 0)] = {"shape": [2], "dtype": "<f8", "start": 0, "stop": 2}
    for w in (0, 1):
        st.handle(WorkerRequest(w, PsOp.CLOCK, 0, 1))
    assert _pull(st, 0, 1) == []
    assert st.next_deadline() == 5.0 and st.expire() == []
    now[0] = 6.0
    (err,) = st.expire()
    assert err.status is PsStatus.ERROR and err.meta["error"] == "CollectiveTimeoutError"
    assert "rank 2 at clock 0" in err.meta["message"] and err.meta["ranks"] == [2]


def test_bad_requests_fail_alone_and_leave_data_intact() -> None:
    st = _state(ps.ASP())
    _push(st, 0, 0, 3.0)
    before = st.shards[("x", 0)].copy()
    bad = [
        WorkerRequest(1, PsOp.PUSH, 5, 0, {"pieces": [["nope", 0]]}, [np.ones(4)]),
        WorkerRequest(1, PsOp.PUSH, 6, 0, {"pieces": [["x", 0]]}, [np.ones(5)]),
        WorkerRequest(1, PsOp.PUSH, 7, 0, {"pieces": [["x", 0]]}, [np.ones(4, np.float32)]),
        WorkerRequest(1, PsOp.PULL, 8, 0, {"pieces": [["nope", 0]]}),
        WorkerRequest(1, PsOp.CLAIM, 9, 0, {"keys": [{"k": "nope"}]}),
        WorkerRequest(1, PsOp.RULE, 10, 0, {}, [np.frombuffer(b"garbage", np.uint8)]),
    ]
    for req in bad:
        (reply,) = st.handle(req)
        assert reply.status is PsStatus.ERROR and reply.meta["error"] == "InvalidArgumentError"
    np.testing.assert_array_equal(st.shards[("x", 0)], before)
    (ok,) = _pull(st, 2, 0)
    assert ok.status is PsStatus.OK and ok.arrays[0][0] == 3.0


def test_lost_worker_fails_parked_and_later_requests() -> None:
    st = _state(ps.BSP())
    st.handle(WorkerRequest(0, PsOp.CLOCK, 0, 1))
    assert _pull(st, 0, 1) == []
    (err,) = st.lost(2, "connection closed")
    assert err.worker == 0 and err.meta["error"] == "PeerLostError" and 2 in err.meta["ranks"]
    (later,) = _pull(st, 1, 0)
    assert later.status is PsStatus.ERROR and "worker rank 2 was lost" in later.meta["message"]
    for w in (0, 1):
        st.handle(WorkerRequest(w, PsOp.BYE, 99, 0))
    assert st.finished()


def test_elastic_loss_drops_the_unfinished_step_and_a_join_starts_at_the_slowest() -> None:
    st = ServerState(0, 9, W, ps.BSP(), park_timeout=5.0, elastic=True)
    st.shards[("x", 0)] = np.zeros(4)
    st.info[("x", 0)] = {"shape": [4], "dtype": "<f8", "start": 0, "stop": 4}
    st.rule = ps.Sum()
    # clock 0: every worker pushes and ends its step; clock 1: workers 0 and 2 finish it,
    # worker 1 pushes and dies before it ends the step
    for w in W:
        _push(st, w, 0, w + 1.0)
        st.handle(WorkerRequest(w, PsOp.CLOCK, 0, 1))
    for w in W:
        _push(st, w, 1, 10.0 * (w + 1))
    for w in (0, 2):
        st.handle(WorkerRequest(w, PsOp.CLOCK, 0, 2))
    assert st.shards[("x", 0)][0] == 6.0  # clock 1 waits for worker 1
    assert _pull(st, 0, 2) == []  # parked behind worker 1
    (served,) = st.lost(1, "connection closed")  # no error: it leaves the clocks
    assert served.worker == 0 and served.status is PsStatus.OK
    assert st.shards[("x", 0)][0] == 6.0 + 10.0 + 30.0  # its unfinished step is dropped
    # a replacement with id 1 joins: it starts at the slowest live clock (2), later than
    # its predecessor's (1), and at barrier 0: the barrier worker 0 waits in waits for it
    assert st.handle(WorkerRequest(0, PsOp.BARRIER, 7, 2)) == []
    (ok,) = [r for r in st.handle(WorkerRequest(1, PsOp.JOIN, 8, 0)) if r.worker == 1]
    assert ok.status is PsStatus.OK and ok.meta == {"clock": 2, "workers": 3}
    assert st.clocks[1] == 2 and st.barriers[1] == 0 and 1 not in st.gone
    assert st.handle(WorkerRequest(2, PsOp.BARRIER, 7, 2)) == []
    released = st.handle(WorkerRequest(1, PsOp.BARRIER, 7, 2))
    assert sorted(r.worker for r in released) == [0, 1, 2]
    # held at 2: clock 2 is applied only once the replacement has finished it too
    for w in W:
        _push(st, w, 2, 100.0)
    for w in (0, 2):
        st.handle(WorkerRequest(w, PsOp.CLOCK, 0, 3))
    assert st.shards[("x", 0)][0] == 46.0
    st.handle(WorkerRequest(1, PsOp.CLOCK, 0, 3))
    assert st.shards[("x", 0)][0] == 346.0
    # a new id joins at the slowest live clock; with nobody live, at the furthest clock
    (new,) = [r for r in st.handle(WorkerRequest(3, PsOp.JOIN, 9, 0)) if r.worker == 3]
    assert new.meta == {"clock": 3, "workers": 4}
    for w in (0, 1, 2, 3):
        st.lost(w, "gone")
    assert not st.finished() and st.waiting_for_a_worker()
    assert st.start_clock(5) == 3
    (back,) = [r for r in st.handle(WorkerRequest(0, PsOp.JOIN, 10, 0)) if r.worker == 0]
    assert back.meta["clock"] == 3 and not st.waiting_for_a_worker()
    st.handle(WorkerRequest(0, PsOp.BYE, 11, 3))
    assert st.finished()


def test_join_is_refused_when_the_job_is_not_elastic() -> None:
    st = _state(ps.BSP())
    (err,) = st.handle(WorkerRequest(1, PsOp.JOIN, 1, 0))
    assert err.status is PsStatus.ERROR and "not elastic" in err.meta["message"]
