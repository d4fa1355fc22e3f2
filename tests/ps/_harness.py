"""Run a worker function on real processes with parameter servers beside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import unison.ps as ps
from unison.testing import run_ranks, spawn
from unison.testing.spawn import Outcome


def _entry(
    fn: Callable[..., Any], policy: ps.Consistency, split_bytes: int, args: tuple[Any, ...]
) -> Any:
    if ps.role() == "server":
        return ps.serve(None, split_bytes=split_bytes)
    kv = ps.init(policy, split_bytes=split_bytes)
    try:
        out = fn(kv, *args)
    except BaseException as exc:
        kv.close(exc)
        raise
    kv.close()
    return out


def _env(servers: int, timeout: float, extra: dict[str, str] | None) -> dict[str, str]:
    return {"UNISON_NUM_SERVERS": str(servers), "UNISON_TIMEOUT": str(timeout), **(extra or {})}


def run_ps(
    fn: Callable[..., Any],
    workers: int,
    servers: int,
    policy: ps.Consistency,
    *,
    args: Sequence[Any] = (),
    split_bytes: int = 1 << 20,
    timeout: float = 20.0,
    env: dict[str, str] | None = None,
) -> tuple[list[Any], list[ps.ServerSummary]]:
    """Worker results (in worker order) and server summaries."""
    out = spawn(
        _entry,
        workers + servers,
        args=(fn, policy, split_bytes, tuple(args)),
        env=_env(servers, timeout, env),
        timeout=3 * timeout,
    )
    return out[:workers], out[workers:]


def run_ps_outcomes(
    fn: Callable[..., Any],
    workers: int,
    servers: int,
    policy: ps.Consistency,
    *,
    args: Sequence[Any] = (),
    timeout: float = 10.0,
) -> list[Outcome]:
    return run_ranks(
        _entry,
        workers + servers,
        args=(fn, policy, 1 << 20, tuple(args)),
        env=_env(servers, timeout, None),
        timeout=3 * timeout,
    )
