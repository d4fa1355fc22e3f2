"""An elastic training job for the tests, steered by environment variables.

Trains a linear model on a fixed synthetic regression set with unison.torch's
``@hvd.elastic.run``, ``TorchState`` and ``ElasticSampler``; commits every batch.

- ``ELASTIC_TEST_DIE="worker-id[,worker-id]@step"``: those workers SIGKILL themselves
  when the committed step reaches ``step`` (a lost host when they are its workers).
- ``ELASTIC_TEST_DIE_AFTER="worker-id[,worker-id]@n"``: those workers SIGKILL
  themselves after completing n steps of their own (new workers of later worlds).
- ``ELASTIC_TEST_GROW="file@step"``: rank 0 appends ``ELASTIC_TEST_GROW_LINE`` to the
  discovery file at ``step`` (a host appears).
- ``ELASTIC_TEST_UNTIL_SIZE=n`` / ``ELASTIC_TEST_UNTIL_ROUND=n``: keep training (up to
  120 s) until the world has n ranks / is round n.
- ``ELASTIC_TEST_DIE_IN_INIT=worker-id`` (with ``ELASTIC_TEST_DIE_IN_INIT_WAITING=n``):
  that worker SIGKILLs itself before ``hvd.init()`` once ranks 0..n-1 of the newest
  world wait for it in the rendezvous.
- ``ELASTIC_TEST_EPOCHS`` (default 2).

Rank 0 prints ``READY`` at step 3 of the first world; a survivor prints
``RECOVERED_AT <wall time> <wall time of the failure> <re-form s> <sync s> <step s>`` at
its first completed step after a failure. At the end each
rank prints ``RESULT rank size round checksum steps``, rank 0 prints ``EPOCH0 samples
distinct`` (the samples of epoch 0 trained on, across resets) and
``RECOVERY seconds`` for each failure: from the first failure it saw to the first
completed step after it.
"""

from __future__ import annotations

import importlib
import os
import signal
import time

import torch

import unison
import unison.torch as hvd
from unison import elastic

erun = importlib.import_module("unison.horovod.elastic")  # its last_failure_at
if os.environ.get("UNISON_ELASTIC_ID", "") in os.environ.get("ELASTIC_TEST_DIE_IN_INIT", "-"):
    # a new member that dies while the others wait for it in the new world's rendezvous
    from unison.elastic.rendezvous import epoch_of
    from unison.store import TCPStore

    host, _, port = os.environ["UNISON_STORE_ADDR"].rpartition(":")
    st = TCPStore(host, int(port), bytes.fromhex(os.environ["UNISON_SECRET"]), timeout=60)
    waiting = int(os.environ["ELASTIC_TEST_DIE_IN_INIT_WAITING"])
    st.wait([f"unison/{epoch_of(elastic.latest_round(st))}/peer/{r}" for r in range(waiting)])
    os.kill(os.getpid(), signal.SIGKILL)
hvd.init()
torch.manual_seed(0)
N, D = 192, 8
gen = torch.Generator().manual_seed(1)
X = torch.randn(N, D, generator=gen)
Y = X @ (torch.arange(1.0, D + 1) / D) + 0.5
dataset = list(range(N))
model = torch.nn.Linear(D, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.2)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
# seen: every sample of epoch 0 trained on by any rank, up to the last commit (rank 0's
# copy is the one synced): an epoch across a reset repeats and skips nothing
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0, seen=[])
BATCH = 8
before_group = unison.new_group(list(range(unison.size())))  # unusable after a reset


def full_loss() -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(X).squeeze(1), Y))


loss0 = full_loss()
EPOCHS = int(os.environ.get("ELASTIC_TEST_EPOCHS", "2"))
UNTIL = int(os.environ.get("ELASTIC_TEST_UNTIL_SIZE", "0"))
UNTIL_ROUND = int(os.environ.get("ELASTIC_TEST_UNTIL_ROUND", "0"))
die = os.environ.get("ELASTIC_TEST_DIE", "")
die_ids, _, die_step = die.partition("@")
die_after = os.environ.get("ELASTIC_TEST_DIE_AFTER", "")
die_after_ids, _, die_after_steps = die_after.partition("@")
my_steps = 0  # steps this process completed
grow = os.environ.get("ELASTIC_TEST_GROW", "")
grow_file, _, grow_step = grow.partition("@")
me = os.environ.get("UNISON_ELASTIC_ID", "")
recoveries: list[float] = []
start = time.monotonic()


reset_at = synced_at = 0.0


def on_reset() -> None:
    global reset_at
    reset_at = time.monotonic()
    print(f"RESET rank={hvd.rank()} size={hvd.size()} round={elastic.current_round()}", flush=True)


state.register_reset_callbacks([on_reset])


def more() -> bool:
    return (UNTIL and hvd.size() < UNTIL) or elastic.current_round() < UNTIL_ROUND


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    global synced_at, my_steps
    synced_at = time.monotonic()  # elastic.run calls this after state.sync()
    while state.epoch < EPOCHS or (more() and time.monotonic() - start < 120):
        idx = list(iter(sampler))
        for b in range(0, len(idx) // BATCH * BATCH, BATCH):
            batch = idx[b : b + BATCH]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(X[batch]).squeeze(1), Y[batch])
            loss.backward()
            for i, p in enumerate(model.parameters()):
                assert p.grad is not None
                p.grad.copy_(hvd.allreduce(p.grad, name=f"g{i}"))
            opt.step()
            if state.epoch == 0:
                everyone = hvd.allgather_object([int(i) for i in batch], name="seen")
                state.seen = state.seen + [i for part in everyone for i in part]
            sampler.record_batch(b // BATCH, BATCH)
            state.step += 1
            if erun.last_failure_at is not None:
                now, failed = time.monotonic(), erun.last_failure_at
                recoveries.append(now - failed)
                erun.last_failure_at = None
                # wall time now, wall time of the failure, then re-form, sync, step seconds
                wall = time.time()
                print(
                    f"RECOVERED_AT {wall:.3f} {wall - (now - failed):.3f} "
                    f"{reset_at - failed:.3f} {synced_at - reset_at:.3f} {now - synced_at:.3f}",
                    flush=True,
                )
            if state.step == 3 and hvd.rank() == 0 and elastic.current_round() == 0:
                print("READY", flush=True)
            if die_step and state.step == int(die_step) and me in die_ids.split(","):
                os.kill(os.getpid(), signal.SIGKILL)
            my_steps += 1
            if die_after_steps and my_steps == int(die_after_steps):
                if me in die_after_ids.split(","):
                    os.kill(os.getpid(), signal.SIGKILL)
            if grow_step and state.step == int(grow_step) and hvd.rank() == 0:
                with open(grow_file, "a") as f:
                    f.write(os.environ["ELASTIC_TEST_GROW_LINE"] + "\n")
            state.commit()
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


train(state)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
check = float(flat.double().sum())
assert (unison.rank(), unison.size()) == (hvd.rank(), hvd.size())  # init() gave the new world
print(
    f"RESULT {hvd.rank()} {hvd.size()} {elastic.current_round()} {check:.10f} {state.step} "
    f"{loss0:.4f} {full_loss():.4f}",
    flush=True,
)
if elastic.current_round() > 0 and hvd.rank() == 0 and hvd.local_rank() == 0:
    try:
        unison.barrier(group=before_group)
        print("OLDGROUP usable", flush=True)
    except RuntimeError as exc:
        print(f"OLDGROUP {exc}", flush=True)
if hvd.rank() == 0:
    print(f"EPOCH0 {len(state.seen)} {len(set(state.seen))}", flush=True)
for r in recoveries:
    print(f"RECOVERY {r:.3f}", flush=True)
hvd.shutdown()
unison.shutdown()
