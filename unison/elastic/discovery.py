"""Where workers may run: a discovery script or a fixed list, minus blacklisted hosts.

Horovod's discovery-script format: the script prints one host per line, ``host`` or
``host:slots`` (a bare host gets ``--slots-per-host``, default 1); it is run again
every second; a non-zero exit fails the job on the first run and is retried later.
A host whose worker failed is blacklisted: for good, or with
``--blacklist-cooldown-range MIN MAX`` for MIN seconds the first time, doubling with
each further failure up to MAX (deterministic, unlike Horovod's random jitter).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from ..errors import InvalidArgumentError, LaunchError

__all__ = [
    "Blacklist",
    "FixedHosts",
    "HostDiscovery",
    "ScriptDiscovery",
    "blacklisted",
    "parse_hosts_output",
]

SCRIPT_TIMEOUT = 30.0  # seconds a discovery script may run


class HostDiscovery(Protocol):
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Host name -> slots, in the order hosts should be used."""
        ...


def parse_hosts_output(text: str, default_slots: int = 1) -> dict[str, int]:
    """``host`` / ``host:slots`` lines (blank lines and ``#`` comments skipped)."""
    out: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, sep, count = line.rpartition(":")
        if not sep:
            host, count = line, str(default_slots)
        try:
            slots = int(count)
        except ValueError:
            raise InvalidArgumentError(
                f"host discovery: {raw!r} is not host or host:slots"
            ) from None
        if not host or slots < 0:
            raise InvalidArgumentError(f"host discovery: {raw!r} is not host or host:slots")
        out[host] = slots
    return out


class FixedHosts:
    """``-H a:2,b:2`` in an elastic job: the same hosts every time (``set`` changes them)."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        self.hosts = dict(hosts)

    def set(self, hosts: Mapping[str, int]) -> None:
        self.hosts = dict(hosts)

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


class ScriptDiscovery:
    """Runs ``script`` through the shell and parses what it prints."""

    def __init__(self, script: str, default_slots: int = 1) -> None:
        self.script = script
        self.default_slots = default_slots

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        try:
            done = subprocess.run(
                self.script,
                shell=True,
                capture_output=True,
                text=True,
                timeout=SCRIPT_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"host discovery script {self.script!r} ran over {SCRIPT_TIMEOUT:g} s"
            ) from None
        if done.returncode != 0:
            raise LaunchError(
                f"Failed to execute discovery script: {self.script}. "
                f"Exit code: {done.returncode}"
                + (f" ({done.stderr.strip()})" if done.stderr else "")
            )
        return parse_hosts_output(done.stdout, self.default_slots)


def blacklisted(host: str, delay: float | None) -> str:
    """How a driver's log names a host it blacklisted for ``delay`` seconds (None: for
    good), in Horovod's words, so a search for Horovod's line finds unison's too."""
    return f"blacklist failing host: {host} (" + (
        "for good)" if delay is None else f"for {delay:g} s)"
    )


class Blacklist:
    """Hosts that failed, each until its cool-down ends (``None``: for good)."""

    def __init__(
        self,
        cooldown_range: tuple[float, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cooldown_range is not None:
            lo, hi = cooldown_range
            if not 0 < lo <= hi:
                raise InvalidArgumentError(
                    f"--blacklist-cooldown-range needs 0 < MIN <= MAX, got {lo} {hi}"
                )
        self.cooldown_range = cooldown_range
        self.clock = clock
        self.failures: dict[str, int] = {}
        self.until: dict[str, float] = {}

    def add(self, host: str) -> float | None:
        """Blacklist ``host``; the seconds it stays there (None: for good)."""
        n = self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown_range is None:
            self.until[host] = float("inf")
            return None
        lo, hi = self.cooldown_range
        delay = float(min(hi, lo * 2 ** (n - 1)))
        self.until[host] = self.clock() + delay
        return delay

    def is_blacklisted(self, host: str) -> bool:
        return self.until.get(host, -1.0) > self.clock()

    def filter(self, hosts: Mapping[str, int]) -> dict[str, int]:
        return {h: n for h, n in hosts.items() if not self.is_blacklisted(h)}
