"""The stall inspector: tensors some ranks submitted long ago and others never did.

Pure logic: the engine reports, after each negotiation cycle, which ranks hold
which pending names; :meth:`StallInspector.check` returns the warnings due now
(each stalled tensor is reported once per ``warn_after`` interval) and the
names past ``shutdown_after`` (0 disables), which the coordinator then fails on
every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Stall", "StallInspector"]


@dataclass(frozen=True)
class Stall:
    name: str
    waited: float
    ready: tuple[int, ...]
    missing: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"{self.name!r} waited {self.waited:.0f}s: submitted by ranks {list(self.ready)}, "
            f"missing on ranks {list(self.missing)}"
        )


@dataclass
class StallInspector:
    size: int
    warn_after: float = 60.0
    shutdown_after: float = 0.0
    enabled: bool = True
    first_seen: dict[str, float] = field(default_factory=dict)
    last_warned: dict[str, float] = field(default_factory=dict)

    def observe(self, holders: Mapping[str, set[int]], now: float) -> None:
        """``holders``: every pending name and the ranks that submitted it."""
        for name in list(self.first_seen):
            if name not in holders:
                del self.first_seen[name]
                self.last_warned.pop(name, None)
        for name in holders:
            self.first_seen.setdefault(name, now)

    def check(self, holders: Mapping[str, set[int]], now: float) -> tuple[list[Stall], list[Stall]]:
        """(stalls to warn about now, stalls past the shutdown time)."""
        warn: list[Stall] = []
        kill: list[Stall] = []
        if not self.enabled:
            return warn, kill
        for name, since in self.first_seen.items():
            have = holders.get(name, set())
            missing = tuple(r for r in range(self.size) if r not in have)
            if not missing:
                continue
            waited = now - since
            stall = Stall(name, waited, tuple(sorted(have)), missing)
            if self.shutdown_after > 0 and waited >= self.shutdown_after:
                kill.append(stall)
            elif waited >= self.warn_after and now - self.last_warned.get(name, -1e18) >= (
                self.warn_after
            ):
                self.last_warned[name] = now
                warn.append(stall)
        return warn, kill

    def next_due(self, now: float) -> float | None:
        """Seconds until the next check could report something (None: nothing pending)."""
        if not self.enabled or not self.first_seen:
            return None
        soonest = min(self.first_seen.values()) + self.warn_after
        return max(0.05, min(soonest - now, self.warn_after))
