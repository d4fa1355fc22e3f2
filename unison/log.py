"""Loggers per subsystem (``unison.tcp``, ``unison.store``, ...), rank in every line.

Under ``unison run``, which already starts each line of a rank with ``[rank]``, the
line carries no second rank: ``[1] unison.tcp WARNING: ...``; elsewhere (mpirun,
torchrun, Slurm) it reads ``unison[1] unison.tcp WARNING: ...``.
"""

from __future__ import annotations

import logging
import os
import sys

from .config import ENV_OUTPUT_TTY, ENV_PREFIX_OUTPUT

__all__ = ["configure", "get_logger", "line_format", "set_rank"]

_state = {"rank": "-"}


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.unison_rank = _state["rank"]
        return True


def get_logger(subsystem: str) -> logging.Logger:
    return logging.getLogger(f"unison.{subsystem}")


def set_rank(rank: int | str) -> None:
    _state["rank"] = str(rank)


def line_format(prefixed: bool) -> str:
    """The log line's format: without the rank where the launcher prefixes it already."""
    if prefixed:
        return "%(name)s %(levelname)s: %(message)s"
    return "unison[%(unison_rank)s] %(name)s %(levelname)s: %(message)s"


def configure(level: str, prefixed: bool | None = None) -> None:
    """Give the ``unison`` logger one stderr handler at ``level`` (idempotent).
    ``prefixed``: the launcher starts each output line with the rank (default: what
    ``unison run`` told this process)."""
    if prefixed is None:
        # unison run sets UNISON_OUTPUT_TTY in each rank, and UNISON_PREFIX_OUTPUT=0 where
        # it does not start the rank's lines with [rank]
        by_unison_run = ENV_OUTPUT_TTY in os.environ
        off = os.environ.get(ENV_PREFIX_OUTPUT, "").strip().lower() in ("0", "false", "no", "off")
        prefixed = by_unison_run and not off
    root = logging.getLogger("unison")
    root.setLevel(level)
    if not any(getattr(h, "_unison", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter(line_format(prefixed)))
        handler._unison = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
