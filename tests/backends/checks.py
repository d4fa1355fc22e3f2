"""One set of API checks, run on every rank under each backend (native, torch, mpi).

Each check computes its expectation with numpy from the ranks' known inputs.
``python tests/backends/checks.py`` runs them all (mpirun uses this form);
:func:`run_all` returns the names of the checks that ran.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable

import numpy as np
import torch

import unison as un
from unison import ReduceOp


def _inputs(n: int, dtype: type, r: int) -> np.ndarray:
    return (np.arange(n) % 7 + r + 1).astype(dtype)


def check_all_reduce() -> None:
    r, p = un.rank(), un.size()
    alls = [_inputs(33, np.float64, q) for q in range(p)]
    oracle: dict[ReduceOp, Callable[[list[np.ndarray]], np.ndarray]] = {
        ReduceOp.SUM: lambda a: np.sum(a, axis=0),
        ReduceOp.PRODUCT: lambda a: np.prod(a, axis=0),
        ReduceOp.MIN: lambda a: np.min(a, axis=0),
        ReduceOp.MAX: lambda a: np.max(a, axis=0),
        ReduceOp.AVG: lambda a: np.mean(a, axis=0),
    }
    for op, fn in oracle.items():
        x = alls[r].astype(np.float32)
        un.all_reduce(x, op)
        np.testing.assert_allclose(x, fn(alls), rtol=1e-6, err_msg=op.name)
    ints = [np.array([0b1011 << q, 0xFF ^ q, q], np.int32) for q in range(p)]
    for op, ufunc in (
        (ReduceOp.BAND, np.bitwise_and),
        (ReduceOp.BOR, np.bitwise_or),
        (ReduceOp.BXOR, np.bitwise_xor),
    ):
        y = ints[r].copy()
        un.all_reduce(y, op)
        assert (y == ufunc.reduce(ints)).all(), op.name
    t = torch.full((4, 5), float(r + 1))  # torch CPU tensors, in place
    un.all_reduce(t)
    assert torch.equal(t, torch.full((4, 5), float(p * (p + 1) // 2)))
    z = np.full(5, 2 * r + 1, np.int64)  # integer AVG truncates
    un.all_reduce(z, ReduceOp.AVG)
    assert (z == sum(2 * q + 1 for q in range(p)) // p).all()


def check_rooted() -> None:
    r, p = un.rank(), un.size()
    root = p - 1
    b = np.full(100, r, np.int16) if r == root else np.zeros(100, np.int16)
    un.broadcast(b, src=root)
    assert (b == root).all()
    x = _inputs(17, np.float64, r)
    before = x.copy()
    un.reduce(x, dst=1 % p)
    if r == 1 % p:
        np.testing.assert_allclose(x, sum(_inputs(17, np.float64, q) for q in range(p)))
    else:
        assert (x == before).all(), "reduce changed a non-root buffer"
    g = [np.empty(3, np.int32) for _ in range(p)] if r == 0 else None
    un.gather(np.full(3, r * 10, np.int32), g, dst=0)
    if g is not None:
        assert [int(v[0]) for v in g] == [q * 10 for q in range(p)]
    s = [np.full(2, q + 100, np.int64) for q in range(p)] if r == root else None
    mine = np.empty(2, np.int64)
    un.scatter(mine, s, src=root)
    assert (mine == r + 100).all()


def check_gather_scatter_family() -> None:
    r, p = un.rank(), un.size()
    outs = [np.empty(4, np.float32) for _ in range(p)]
    un.all_gather(outs, np.full(4, r, np.float32))
    assert [float(o[0]) for o in outs] == list(range(p))
    whole = np.empty(4 * p, np.float32)
    un.all_gather_into_tensor(whole, np.full(4, r + 1, np.float32))
    assert (whole == np.repeat(np.arange(1, p + 1), 4)).all()
    ins = [np.full(3, r * p + q, np.float64) for q in range(p)]
    out = np.empty(3, np.float64)
    un.reduce_scatter(out, ins)
    assert (out == sum(q * p + r for q in range(p))).all()
    big = np.arange(5 * p, dtype=np.int64) + r
    o2 = np.empty(5, np.int64)
    un.reduce_scatter_tensor(o2, big, ReduceOp.MAX)
    assert (o2 == np.arange(5 * r, 5 * r + 5) + p - 1).all()
    # all_to_all with uneven blocks: rank r sends q+1 elements of value 10r+q to rank q
    send = [np.full(q + 1, 10 * r + q, np.int32) for q in range(p)]
    recv = [np.empty(r + 1, np.int32) for _ in range(p)]
    un.all_to_all(recv, send)
    for q in range(p):
        assert (recv[q] == 10 * q + r).all()
    src = np.repeat(np.arange(p) + 100 * r, 2).astype(np.float32).reshape(2 * p, 1)
    dst = np.empty_like(src)
    un.all_to_all_single(dst, src)
    assert (dst.reshape(-1) == np.repeat(np.arange(p) * 100 + r, 2)).all()
    un.barrier()


def check_async_and_groups() -> None:
    r, p = un.rank(), un.size()
    xs = [np.full(1000, r + k, np.float64) for k in range(3)]
    works = [un.all_reduce(x, async_op=True) for x in xs]
    for k, w in enumerate(works):
        assert isinstance(w, un.Work)
        w.wait()
        assert w.is_completed() and w.exception() is None
        assert (xs[k] == sum(q + k for q in range(p))).all()
    w = un.barrier(async_op=True)
    assert w.wait()
    evens = list(range(0, p, 2))
    g = un.new_group(evens)
    if r in evens:
        y = np.array([r], np.int64)
        un.all_reduce(y, group=g)
        assert int(y[0]) == sum(evens)
        b = np.array([r], np.int64)
        un.broadcast(b, src=evens[-1], group=g)
        assert int(b[0]) == evens[-1]
    else:
        try:
            un.all_reduce(np.zeros(1), group=g)
        except un.InvalidArgumentError as exc:
            assert "not a member" in str(exc)
        else:
            raise AssertionError("a non-member used a group")
    try:
        un.all_reduce(np.zeros(3, np.float32), ReduceOp.BAND)
    except un.InvalidArgumentError:
        pass
    else:
        raise AssertionError("BAND on floats was accepted")
    un.barrier()


def check_p2p() -> None:
    r, p = un.rank(), un.size()
    right, left = (r + 1) % p, (r - 1) % p
    got = np.empty(64, np.float32)
    rw = un.irecv(got, left, tag=7)
    sw = un.isend(np.full(64, r, np.float32), right, tag=7)
    sw.wait()
    rw.wait()
    assert (got == left).all()
    if r == 0:
        un.send(np.arange(10, dtype=np.int64), 1, tag=3)
    elif r == 1:
        buf = np.empty(10, np.int64)
        un.recv(buf, 0, tag=3)
        assert (buf == np.arange(10)).all()
    un.barrier()


def check_any_source() -> None:
    """recv/irecv without a source, as on the native engine: the first message of any
    rank of the group; the sender (a global rank) is returned and is the Work's source."""
    r, p = un.rank(), un.size()
    if r == 0:
        senders = []
        for _ in range(p - 1):
            buf = np.empty(8, np.int64)
            src = un.recv(buf)
            assert (buf == 1000 + src).all(), (src, buf)
            senders.append(src)
        assert sorted(senders) == list(range(1, p)), senders
        f = np.empty(3, np.float32)
        w = un.irecv(f, tag=5)
        w.wait()
        assert w.source == p - 1 and (f == p - 1).all(), (w.source, f)
        w = un.irecv(f, p - 1, tag=6)  # a receive from a named rank names it too
        w.wait()
        assert w.source == p - 1 and (f == -1).all(), (w.source, f)
    else:
        un.send(np.full(8, 1000 + r, np.int64), 0)
        if r == p - 1:
            un.send(np.full(3, r, np.float32), 0, tag=5)
            un.send(np.full(3, -1, np.float32), 0, tag=6)
    # a sub-group: the engine's rank in the group becomes the global rank
    g = un.new_group([0, p - 1])
    if r == 0:
        buf = np.empty(2, np.int32)
        assert un.recv(buf, tag=9, group=g) == p - 1
        assert (buf == 7).all()
    elif r == p - 1:
        un.send(np.full(2, 7, np.int32), 0, tag=9, group=g)
    un.barrier()


def check_objects() -> None:
    r, p = un.rank(), un.size()
    obj = un.broadcast_object({"step": 5, "who": r} if r == 0 else None, src=0)
    assert obj == {"step": 5, "who": 0}
    assert un.all_gather_object(("r", r) * (r + 1)) == [("r", q) * (q + 1) for q in range(p)]
    gathered = un.gather_object(r * r, dst=0)
    assert gathered == ([q * q for q in range(p)] if r == 0 else None)
    assert un.scatter_object([f"x{q}" for q in range(p)] if r == 0 else None, src=0) == f"x{r}"


def check_group_options() -> None:
    """new_group's keywords on every backend: the group's own timeout, an arena it may
    not reserve; the group computes as any other; wait_quiet never raises."""
    r, p = un.rank(), un.size()
    g = un.new_group(timeout=datetime.timedelta(seconds=45), shared_arena=False)
    assert g.config.timeout == 45.0
    alls = [_inputs(100_000, np.float64, q) for q in range(p)]
    x = alls[r].copy()
    w = un.all_reduce(x, group=g, async_op=True)
    assert w.wait_quiet(60) and w.exception() is None
    np.testing.assert_allclose(x, np.sum(alls, axis=0))
    assert isinstance(g.caller_thread_collectives, bool)
    if g.backend.name != "native":
        assert not g.caller_thread_collectives


CHECKS = [
    check_all_reduce,
    check_rooted,
    check_gather_scatter_family,
    check_async_and_groups,
    check_p2p,
    check_any_source,
    check_objects,
    check_group_options,
]


def run_all() -> list[str]:
    ran = []
    for check in CHECKS:
        check()
        ran.append(check.__name__)
    return ran


if __name__ == "__main__":  # under mpirun: python tests/backends/checks.py
    un.init(backend="mpi", timeout=60)
    try:
        names = run_all()
        assert un.get_world_group().backend.name == "mpi"
        print(f"rank {un.rank()}/{un.size()} OK {len(names)} checks", flush=True)
    finally:
        un.shutdown()
    sys.exit(0)
