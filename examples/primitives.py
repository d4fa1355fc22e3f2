"""Every unison primitive once, checked against the expected values.

unison run -np 4 python examples/primitives.py
"""

from __future__ import annotations

import numpy as np

import unison as un


def main() -> None:
    un.init()
    r, p = un.rank(), un.size()

    def say(what: str) -> None:
        un.barrier()
        if r == 0:
            print(f"ok  {what}")

    x = np.full(1000, r, np.float32)
    un.all_reduce(x)
    assert (x == sum(range(p))).all()
    say(f"all_reduce SUM over {p} ranks -> {x[0]:g}")

    w = un.all_reduce(np.full(8, r, np.int64), op=un.ReduceOp.MAX, async_op=True)
    w.wait()
    say("all_reduce MAX, async, Work.wait()")

    b = np.arange(5.0) if r == 0 else np.zeros(5)
    un.broadcast(b, src=0)
    assert (b == np.arange(5.0)).all()
    say("broadcast from rank 0")

    y = np.full(4, r + 1, np.int32)
    un.reduce(y, dst=p - 1, op=un.ReduceOp.PRODUCT)
    if r == p - 1:
        assert (y == np.prod(np.arange(1, p + 1))).all()
    say(f"reduce PRODUCT to rank {p - 1}")

    outs = [np.empty(3, np.float64) for _ in range(p)]
    un.all_gather(outs, np.full(3, r, np.float64))
    assert [o[0] for o in outs] == list(range(p))
    say("all_gather")

    gl = [np.empty(2, np.int16) for _ in range(p)] if r == 0 else None
    un.gather(np.full(2, r, np.int16), gl, dst=0)
    if gl is not None:
        assert [int(g[0]) for g in gl] == list(range(p))
    say("gather to rank 0")

    got = np.empty(2, np.int16)
    un.scatter(got, [np.full(2, k * 10, np.int16) for k in range(p)] if r == 0 else None, src=0)
    assert (got == r * 10).all()
    say("scatter from rank 0")

    rs = np.empty(2, np.float32)
    un.reduce_scatter(rs, [np.full(2, k, np.float32) for k in range(p)])
    assert (rs == r * p).all()
    say("reduce_scatter")

    recv = [np.empty(1, np.int64) for _ in range(p)]
    un.all_to_all(recv, [np.array([r * 100 + k]) for k in range(p)])
    assert [int(v[0]) for v in recv] == [k * 100 + r for k in range(p)]
    say("all_to_all")

    bits = np.array([1 << r], np.uint8)
    un.all_reduce(bits, op=un.ReduceOp.BOR)
    assert int(bits[0]) == (1 << p) - 1
    say("all_reduce BOR (bitwise)")

    nxt, prv = (r + 1) % p, (r - 1) % p
    sent = un.isend(np.array([r], np.int64), dst=nxt, tag=3)
    box = np.empty(1, np.int64)
    un.irecv(box, src=prv, tag=3).wait()
    sent.wait()
    assert box[0] == prv
    say("isend/irecv around a ring")

    half = un.new_group(list(range(0, p, 2)))
    if r % 2 == 0:
        z = np.ones(3)
        un.all_reduce(z, group=half)
        assert (z == len(range(0, p, 2))).all()
    say("sub-group all_reduce (even ranks)")

    objs = un.all_gather_object({"rank": r})
    assert [o["rank"] for o in objs] == list(range(p))
    say("all_gather_object")

    try:
        un.broadcast(np.zeros(1), src=p)
    except un.InvalidArgumentError as exc:
        if r == 0:
            print(f"ok  bad input is refused before sending: {exc}")
    un.shutdown()


if __name__ == "__main__":
    main()
