"""Helpers: run a test body on real ranks with unison.torch initialized."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from unison.testing import run_ranks, spawn  # noqa: E402


def _wrapped(fn: Callable[..., Any], *args: Any) -> Any:
    import unison.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    try:
        return fn(*args)
    finally:
        hvd.shutdown()


def hvd_spawn(
    fn: Callable[..., Any],
    np: int,
    *args: Any,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> list[Any]:
    base = {"UNISON_TIMEOUT": "30"}
    return spawn(_wrapped, np, args=(fn, *args), env={**base, **(env or {})}, timeout=timeout)


def hvd_outcomes(
    fn: Callable[..., Any],
    np: int,
    *args: Any,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> list[Any]:
    base = {"UNISON_TIMEOUT": "30"}
    return run_ranks(_wrapped, np, args=(fn, *args), env={**base, **(env or {})}, timeout=timeout)
