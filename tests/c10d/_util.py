"""Launching torch.distributed jobs on real processes for the c10d tests."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

from unison.testing.spawn import Outcome, run_ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
