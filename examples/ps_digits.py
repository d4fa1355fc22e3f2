"""The digits classifier trained through the parameter server, with a chosen consistency.

    unison run -np 6 --servers 2 python examples/ps_digits.py --consistency ssp --staleness 3 \\
        --straggler 3:2

Four workers and two servers. The model is a small numpy MLP (64-64-10, ReLU,
softmax) on scikit-learn's bundled handwritten digits (no download); each worker
trains on its own shard of the training set. Every step a worker pulls the
parameters, computes a gradient on a mini-batch, pushes it (divided by the number
of workers), and ends its clock; the servers apply SGD with momentum. A step's
compute is emulated as ``--compute-ms`` of sleep (the MLP itself takes well under
a millisecond), and ``--straggler RANK:FACTOR`` makes worker RANK that many times
slower, so the consistency policies can be compared on a 2-core machine.

Elastic (``--lose-worker-at STEP``: worker 1 is SIGKILLed at that step; the launcher
starts a replacement with id 1, which joins the running servers and does the steps
left)::

    unison run -np 5 --min-np 4 --max-np 5 --servers 1 -H localhost:4,127.0.0.1:2 \\
        python examples/ps_digits.py --lose-worker-at 40

Worker 0 records the full training loss on the parameters it pulled every
``--eval-every`` steps; with ``--out FILE`` it writes the curve, the final test
accuracy and timings as JSON (``benchmarks/ps_experiment.py`` reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

import unison.ps as ps


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


def init_params(hidden: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((64, hidden)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, 10)) * np.sqrt(1 / hidden)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    z = h @ p["w2"] + p["b2"]
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return h, e / e.sum(axis=1, keepdims=True)


def loss_acc(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    _, prob = forward(p, x)
    loss = float(-np.log(prob[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((prob.argmax(axis=1) == y).mean())


def gradients(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    h, prob = forward(p, x)
    dz = prob
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = (dz @ p["w2"].T) * (h > 0)
    return {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ dz, "b2": dz.sum(0)}


def policy(name: str, staleness: int) -> ps.Consistency:
    return {"bsp": ps.BSP(), "asp": ps.ASP(), "ssp": ps.SSP(staleness)}[name]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--consistency", choices=["bsp", "asp", "ssp"], default="bsp")
    ap.add_argument("--staleness", type=int, default=3)
    ap.add_argument("--straggler", default="", metavar="RANK:FACTOR")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--lose-worker-at",
        type=int,
        default=-1,
        metavar="STEP",
        help="SIGKILL worker 1 at this step (elastic jobs: a replacement joins)",
    )
    args = ap.parse_args()

    kv = ps.init(policy(args.consistency, args.staleness))  # servers serve here and exit
    slow_rank, factor = -1, 1.0
    if args.straggler:
        r, _, f = args.straggler.partition(":")
        slow_rank, factor = int(r), float(f or 2)
    xtr, ytr, xte, yte = load(args.seed)
    xs, ys = xtr[kv.rank :: kv.num_workers], ytr[kv.rank :: kv.num_workers]
    params = kv.init_params(init_params(args.hidden, args.seed + 1 + kv.rank))
    kv.set_optimizer(ps.SGD(lr=args.lr, momentum=args.momentum))
    kv.barrier()  # a replacement's returns at once: the others passed it
    if kv.joined_at is not None:
        print(f"worker {kv.rank} joined the running job at step {kv.joined_at}")
    rng = np.random.default_rng(args.seed + 100 + kv.rank)
    delay = args.compute_ms / 1000 * (factor if kv.rank == slow_rank else 1.0)
    curve: list[tuple[float, int, float]] = []
    start = time.perf_counter()
    while kv.current_clock < args.steps:  # a replacement does the steps left
        step = kv.current_clock
        if step == args.lose_worker_at and kv.rank == 1 and kv.joined_at is None:
            os.kill(os.getpid(), signal.SIGKILL)
        kv.pull(params)  # into the same arrays every step
        if kv.rank == 0 and step % args.eval_every == 0:
            curve.append((time.perf_counter() - start, step, loss_acc(params, xtr, ytr)[0]))
        idx = rng.choice(len(ys), args.batch_size, replace=False)
        grads = gradients(params, xs[idx], ys[idx])
        time.sleep(delay)
        kv.push({k: g / kv.num_workers for k, g in grads.items()})
        kv.clock()
    mine = time.perf_counter() - start
    kv.barrier()
    total = time.perf_counter() - start
    if kv.rank == 0:
        kv.pull(params)
        loss, _ = loss_acc(params, xtr, ytr)
        curve.append((total, args.steps, loss))
        _, acc = loss_acc(params, xte, yte)
        label = args.consistency.upper() + (
            f"({args.staleness})" if args.consistency == "ssp" else ""
        )
        print(
            f"{label}: worker 0 finished its {args.steps} steps in {mine:.2f} s, all workers "
            f"in {total:.2f} s; train loss {loss:.4f}, test accuracy {acc:.4f}"
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "mode": label,
                        "curve": curve,
                        "final_loss": loss,
                        "test_accuracy": acc,
                        "worker0_time": mine,
                        "total_time": total,
                        "args": vars(args),
                    },
                    f,
                )
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
