"""Helpers for tests of code built on unison: real processes, a numpy oracle."""

from .oracle import reduce_oracle
from .spawn import ChildFailed, Outcome, run_ranks, spawn

__all__ = ["ChildFailed", "Outcome", "reduce_oracle", "run_ranks", "spawn"]
