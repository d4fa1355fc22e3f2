"""Loggers per subsystem (``unison.tcp``, ``unison.store``, ...), rank in every line."""

from __future__ import annotations

import logging
import sys

__all__ = ["configure", "get_logger", "set_rank"]

_state = {"rank": "-"}


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.unison_rank = _state["rank"]
        return True


def get_logger(subsystem: str) -> logging.Logger:
    return logging.getLogger(f"unison.{subsystem}")


def set_rank(rank: int | str) -> None:
    _state["rank"] = str(rank)


def configure(level: str) -> None:
    """Give the ``unison`` logger one stderr handler at ``level`` (idempotent)."""
    root = logging.getLogger("unison")
    root.setLevel(level)
    if not any(getattr(h, "_unison", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankFilter())
        handler.setFormatter(
            logging.Formatter("unison[%(unison_rank)s] %(name)s %(levelname)s: %(message)s")
        )
        handler._unison = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
