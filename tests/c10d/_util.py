"""Launching torch.distributed jobs on real processes for the c10d tests."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from typing import Any

from unison.testing.spawn import Outcome, run_ranks


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for a bind to port 0."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port for a job's torch store, below the kernel's ephemeral range.

    The job's rank 0 binds it a moment later. A port from a bind to port 0 could be handed
    to another process in that moment (a parallel test's store did take one: rank 0 failed
    with EADDRINUSE and rank 1 talked to that store); below the ephemeral range only an
    explicit bind can take it, and only this helper binds there."""
    top = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, top - 12000), top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def run(
    fn: Callable[..., Any],
    size: int,
    *,
    transport: str = "auto",
    args: Sequence[Any] = (),
    env: dict[str, str] | None = None,
    timeout: float = 100.0,
    init: bool = False,
    on_start: Callable[[list[Any]], None] | None = None,
) -> list[Outcome]:
    """Run ``fn`` on ``size`` ranks with a fresh torch rendezvous address (C10D_INIT)."""
    job_env = {
        "C10D_INIT": f"tcp://127.0.0.1:{free_port()}",
        "UNISON_TRANSPORT": transport,
        "UNISON_TIMEOUT": "60",
        **(env or {}),
    }
    return run_ranks(
        fn, size, args=args, env=job_env, timeout=timeout, init=init, on_start=on_start
    )


def values(outs: list[Outcome]) -> list[Any]:
    bad = [o.describe() for o in outs if not o.ok]
    assert not bad, "\n".join(bad)
    return [o.value for o in outs]


def _script(path: str, argv: list[str], port: int) -> int:
    import os
    import runpy
    import sys

    # torchrun's variables (until `unison run` exports them itself)
    os.environ.update(
        RANK=os.environ["UNISON_RANK"],
        WORLD_SIZE=os.environ["UNISON_SIZE"],
        LOCAL_RANK=os.environ["UNISON_RANK"],
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # torchrun gives each of several ranks on a host OMP_NUM_THREADS=1 (as unison run
    # gives each its share of the cores); torch was imported before the fork, so the
    # variable alone comes too late
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))  # as `python path` does (sibling imports)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    return 0


def run_script(path: str, size: int, argv: Sequence[str] = (), timeout: float = 110.0) -> None:
    """Run an example script on ``size`` real processes with torchrun's environment."""
    values(run(_script, size, args=(path, list(argv), free_port()), timeout=timeout))
