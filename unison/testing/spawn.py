"""Run a function on N real processes, as ranks of one job, and collect the results.

The parent hosts the rendezvous store (authenticated, as under ``unison run``);
each child gets the job environment, calls :func:`unison.init`, runs
``fn(*args)`` and reports its return value or its exception. :func:`spawn`
re-raises child failures tagged with the rank; :func:`run_ranks` returns every
rank's :class:`Outcome` for tests that expect failures.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import secrets
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from .. import config as C
from ..store import TCPStoreServer
from ..transport.shm_segment import cleanup_job

__all__ = ["ChildFailed", "Outcome", "run_ranks", "spawn"]


@dataclass
class Outcome:
    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    elapsed: float = 0.0

    def describe(self) -> str:
        if self.ok:
            return f"rank {self.rank}: ok"
        if self.error_type:
            return f"rank {self.rank}: {self.error_type}: {self.message}\n{self.traceback}"
        return f"rank {self.rank}: died (exit code {self.exitcode}) without reporting"


class ChildFailed(AssertionError):
    """One or more ranks raised; the message holds each failing rank's traceback."""

    def __init__(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes = list(outcomes)
        bad = [o.describe() for o in outcomes if not o.ok]
        super().__init__("\n".join(bad))


def _child(
    fn: Callable[..., Any],
    rank: int,
    size: int,
    env: dict[str, str],
    args: tuple[Any, ...],
    conn: Connection,
    init: bool,
) -> None:
    os.environ.update(env)
    os.environ[C.ENV_RANK] = str(rank)
    tempfile.tempdir = None  # a forked child inherits the parent's: read TMPDIR again
    import unison

    start = time.monotonic()
    try:
        if init:
            unison.init()
        value = fn(*args)
        out = Outcome(rank, True, value)
    except BaseException as exc:
        out = Outcome(rank, False, None, type(exc).__name__, str(exc), traceback.format_exc())
    finally:
        try:
            unison.shutdown()
        except Exception:
            pass
    out.elapsed = time.monotonic() - start
    try:
        # plain pickle: multiprocessing's pickler would share torch tensors through
        # file descriptors that die with this process
        conn.send_bytes(pickle.dumps(out))
    except Exception:
        conn.send_bytes(
            pickle.dumps(
                Outcome(
                    rank,
                    out.ok,
                    repr(out.value),
                    out.error_type,
                    out.message,
                    out.traceback,
                    elapsed=out.elapsed,
                )
            )
        )
    conn.close()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    start_method: str = "fork",
    init: bool = True,
    on_start: Callable[[list[Any]], None] | None = None,
) -> list[Outcome]:
    """Run ``fn(*args)`` on ``world_size`` processes; every rank's outcome, in rank order.

    ``on_start(processes)`` runs in the parent once the children are started (fault
    tests use it to kill or stop one). Children still running at ``timeout`` are
    killed and reported with ``error_type='Timeout'``.

    The children's temporary files go to a directory of the job's (``TMPDIR``, unless
    ``env`` names one), removed when they have ended: a child ends without running
    the interpreter's exit handlers (multiprocessing's ``os._exit``), so files that
    libraries remove at exit (TensorFlow's autograph modules) would stay behind.
    """
    ctx: Any = mp.get_context(start_method)
    secret = secrets.token_bytes(32)
    server = TCPStoreServer("127.0.0.1", 0, secret).start()
    host, port = server.address
    scratch = tempfile.mkdtemp(prefix="unison-ranks-")
    job_env = {
        C.ENV_SIZE: str(world_size),
        C.ENV_STORE_ADDR: f"{host}:{port}",
        C.ENV_SECRET: secret.hex(),
        C.ENV_JOB_ID: f"test-{secrets.token_hex(4)}",
        "TMPDIR": scratch,
        **(dict(env) if env else {}),
    }
    procs, pipes = [], []
    try:
        for r in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_child,
                args=(fn, r, world_size, job_env, tuple(args), child, init),
                name=f"unison-rank-{r}",
                daemon=True,
            )
            p.start()
            child.close()
            procs.append(p)
            pipes.append(parent)
        if on_start is not None:
            on_start(procs)
        outcomes: dict[int, Outcome] = {}
        deadline = time.monotonic() + timeout
        waiting = {pipes[r]: r for r in range(world_size)}
        while waiting and time.monotonic() < deadline:
            for conn in wait(
                list(waiting), timeout=min(0.5, max(0.0, deadline - time.monotonic()))
            ):
                r = waiting.pop(conn)
                try:
                    outcomes[r] = pickle.loads(conn.recv_bytes())  # type: ignore[union-attr]
                except EOFError:
                    procs[r].join(5)
                    outcomes[r] = Outcome(r, False, exitcode=procs[r].exitcode)
        for r in waiting.values():
            outcomes[r] = Outcome(
                r, False, error_type="Timeout", message=f"still running after {timeout:g}s; killed"
            )
        return [outcomes[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except (ProcessLookupError, TypeError):
                    pass
                p.kill()
            p.join(5)
        for c in pipes:
            c.close()
        server.close()
        cleanup_job(job_env[C.ENV_JOB_ID])  # segments of ranks killed before unlinking them
        shutil.rmtree(scratch, ignore_errors=True)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    start_method: str = "fork",
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return values in rank order.

    Raises :class:`ChildFailed` (an AssertionError) naming every rank that failed.
    """
    outs = run_ranks(fn, world_size, args=args, timeout=timeout, env=env, start_method=start_method)
    if not all(o.ok for o in outs):
        raise ChildFailed(outs)
    return [o.value for o in outs]
