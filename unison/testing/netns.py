"""Test hosts made of Linux network namespaces joined by veth pairs.

``NetnsHosts(n)`` creates namespaces ``<prefix>-0 .. <prefix>-<n-1>`` on one bridge-less
star: host 0 is joined to every other host by a veth pair with addresses
``10.<net>.<i>.1`` (host 0 side) and ``10.<net>.<i>.2`` (host i side). Links can be
shaped (tbf rate; netem delay/loss when the kernel has it) and cut. Everything is
removed by :meth:`close` (and at interpreter exit). Needs root and ``ip``/``tc``;
:func:`unavailable` says why not when they are missing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess

__all__ = ["NetnsHosts", "netem_available", "unavailable"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    name = f"unprobe-{os.getpid()}"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class NetnsHosts:
    def __init__(self, n: int, net: int | None = None) -> None:
        self.n = n
        self.net = net if net is not None else 200 + os.getpid() % 50
        self.prefix = f"un{os.getpid()}"
        self.names = [f"{self.prefix}-{i}" for i in range(n)]
        self._created: list[str] = []
        atexit.register(self.close)
        try:
            for name in self.names:
                _ip("netns", "add", name)
                self._created.append(name)
                _ip("-n", name, "link", "set", "lo", "up")
            for i in range(1, n):
                a, b = self.dev(i, 0), self.dev(i, 1)
                _ip("link", "add", a, "type", "veth", "peer", "name", b)
                _ip("link", "set", a, "netns", self.names[0])
                _ip("link", "set", b, "netns", self.names[i])
                _ip("-n", self.names[0], "addr", "add", f"{self.addr(i, 0)}/24", "dev", a)
                _ip("-n", self.names[i], "addr", "add", f"{self.addr(i, 1)}/24", "dev", b)
                _ip("-n", self.names[0], "link", "set", a, "up")
                _ip("-n", self.names[i], "link", "set", b, "up")
        except BaseException:
            self.close()
            raise

    def dev(self, link: int, side: int) -> str:
        return f"{self.prefix[-6:]}l{link}{'ab'[side]}"

    def addr(self, link: int, side: int) -> str:
        return f"10.{self.net}.{link}.{side + 1}"

    def host_addr(self, host: int) -> str:
        """An address of ``host`` reachable from host 0 (and host 0's from link 1)."""
        return self.addr(1, 0) if host == 0 else self.addr(host, 1)

    def exec_prefix(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[host]]

    def shape(self, link: int, rate: str = "", delay_ms: float = 0.0, loss: float = 0.0) -> None:
        """Shape both directions of a link: tbf ``rate``; netem ``delay_ms``/``loss``."""
        for side, host in ((0, 0), (1, link)):
            dev = self.dev(link, side)
            if delay_ms or loss:
                spec = ["netem"]
                if delay_ms:
                    spec += ["delay", f"{delay_ms}ms"]
                if loss:
                    spec += ["loss", f"{loss}%"]
                if rate:
                    spec += ["rate", rate]
            else:
                spec = ["tbf", "rate", rate, "burst", "64kb", "latency", "100ms"]
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.names[host],
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    *spec,
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=20,
            )

    def cut(self, link: int) -> None:
        _ip("-n", self.names[0], "link", "set", self.dev(link, 0), "down")

    def close(self) -> None:
        for name in reversed(self._created):
            _ip("netns", "del", name, check=False)
        self._created.clear()


def netem_available(hosts: NetnsHosts) -> bool:
    r = subprocess.run(
        [*hosts.exec_prefix(0), "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if r.returncode == 0:
        subprocess.run(
            [*hosts.exec_prefix(0), "tc", "qdisc", "del", "dev", "lo", "root"],
            capture_output=True,
            timeout=20,
        )
        return True
    return False
