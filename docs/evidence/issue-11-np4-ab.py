"""Interleaved A/B in one job (issue 11, round 5): how a rank of the blocking small-message
lane waits once it has nothing left to do but sleep, with more ranks than cores.

Variants (set on every rank for a block, the same order everywhere; blocks alternate):

* ``one``: yield once, then sleep on the missing peer's futex (round 4; UNISON_WAIT_ADAPT=0)
* ``poll``: yield-poll for the policy's yield budget (4 mean responses, 0.2-5 ms) before the futex
* ``adapt``: per epoch of 64 waits, ``one`` or ``poll`` by the time per call each gave lately
  (UNISON_WAIT_ADAPT=1)

Per variant and operation: [min, median] over blocks of the slowest rank's mean us per call,
and medians per call and rank of voluntary / involuntary context switches, CPU us (this
process), and futex sleeps (FUTEX_WAIT calls: a call may sleep more than once).

    unison run -np 4 python docs/evidence/issue-11-np4-ab.py      # N=500 calls, B=8 rounds
    N=2000 B=10 OPS=all_reduce unison run -np 4 python docs/evidence/issue-11-np4-ab.py
    WHO=1 ...  # also: in the last round, each rank's futex sleeps per call on each peer
"""

import json
import os
import resource
import statistics
import time

import numpy as np

import unison as un
from unison.transport import seqwait

un.init()
N = int(os.environ.get("N", "500"))
B = int(os.environ.get("B", "8"))
OPS = os.environ.get("OPS", "all_reduce,broadcast").split(",")
VARIANTS = os.environ.get("VARIANTS", "one,poll,adapt").split(",")
slots = un.get_world_group().lane.slots
pol = slots.policy
me, p = un.rank(), un.size()
x = np.ones(2, np.float32)
sleeps = [0]
_wait = seqwait.futex.wait


by_peer = dict.fromkeys(slots.addrs, 0)  # futex sleeps on each peer's seq word


def _counting_wait(addr: int, expected: int, timeout: float) -> None:
    sleeps[0] += 1
    if addr in by_peer:
        by_peer[addr] += 1
    _wait(addr, expected, timeout)


seqwait.futex.wait = _counting_wait  # type: ignore[assignment]


def setv(v: str) -> None:
    pol.adapt = v == "adapt"
    if v == "adapt":  # resume learning: the next epoch starts a fresh sample
        pol._epoch_t = 0.0
        pol.yields = 1 if pol.arm == 0 else 1 << 30
    else:
        pol.yields = 1 if v == "one" else 1 << 30


def call(op: str) -> None:
    if op == "all_reduce":
        un.all_reduce(x)
    elif op == "broadcast":
        un.broadcast(x, 0)
    elif op == "barrier":
        un.barrier()


for op in OPS:
    for _ in range(200):
        call(op)
res = {(v, op): [] for v in VARIANTS for op in OPS}
cs = {(v, op): [] for v in VARIANTS for op in OPS}
for b in range(B):
    order = VARIANTS if b % 2 == 0 else VARIANTS[::-1]
    for v in order:
        for op in OPS:
            setv(v)
            for _ in range(20):  # settle the new variant (and the policy) first
                call(op)
            un.barrier()
            sleeps[0] = 0
            by_peer.update(dict.fromkeys(by_peer, 0))
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            for _ in range(N):
                call(op)
            dt = (time.perf_counter() - t) / N * 1e6
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / N * 1e6
            row = np.array(
                [
                    dt,
                    (r1.ru_nvcsw - r0.ru_nvcsw) / N,
                    (r1.ru_nivcsw - r0.ru_nivcsw) / N,
                    cpu,
                    sleeps[0] / N,
                ],
                np.float64,
            )
            if v == "adapt" and os.environ.get("DEBUG"):
                print(
                    me, op, "arm", pol.arm, "arm_cost_us", [round(c * 1e6, 1) for c in pol.arm_cost]
                )
            if os.environ.get("WHO") and b == B - 1:  # which rank slept on which
                who = {q: round(by_peer[a] / N, 2) for q, a in enumerate(slots.addrs) if q != me}
                print("WHO", me, v, op, "sleeps per call on rank", who, flush=True)
            setv("one")
            every = np.zeros(5 * p, np.float64)
            un.all_gather_into_tensor(every, row)
            every = every.reshape(p, 5)
            res[v, op].append(float(every[:, 0].max()))
            cs[v, op].append(every[:, 1:].mean(axis=0))
if me == 0:
    load = os.getloadavg()[0]
    print(f"np={p} N={N} B={B} load={load:.1f}")
    for op in OPS:
        for v in VARIANTS:
            r, c = res[v, op], cs[v, op]
            med = [round(statistics.median(float(e[i]) for e in c), 2) for i in range(4)]
            print(
                "RESULT",
                json.dumps(
                    {
                        "op": op,
                        "variant": v,
                        "min_med_us": [round(min(r), 1), round(statistics.median(r), 1)],
                        "vcs_ivcs_cpu_sleeps": med,
                    }
                ),
                flush=True,
            )
