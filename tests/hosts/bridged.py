"""Namespaced test hosts on one switch, with the launcher's (root) namespace on it too.

:class:`unison.testing.netns.NetnsHosts` joins host 0 to every other host; a launcher
in the root namespace reaches none of them. A real cluster has a head node and every
node on one switch, so here: a *switch* namespace holds a bridge; every host
namespace has one interface ``un0`` (10.N.0.<i+1>/24) on it, and so does the root
namespace (10.N.0.254), where ``unison run`` and its rendezvous store live. Shaping
a host's ``un0`` (tbf) is shaping its NIC. Everything goes with :meth:`close`.
"""

from __future__ import annotations

import atexit
import os
import subprocess

__all__ = ["BridgedHosts"]

IFACE = "un0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


class BridgedHosts:
    _made = 0

    def __init__(self, n: int) -> None:
        BridgedHosts._made += 1  # two sets at once get distinct names and subnets
        self.net = 150 + (os.getpid() * 4 + BridgedHosts._made) % 50
        tag = f"ub{os.getpid() % 10000}{BridgedHosts._made % 10}"
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-{i}" for i in range(n)]
        self._tag = tag
        self._ns: list[str] = []
        self._root_dev = f"{tag}r"
        atexit.register(self.close)
        try:
            self._build(n)
        except BaseException:
            self.close()
            raise

    def _build(self, n: int) -> None:
        _ip("netns", "add", self.switch)
        self._ns.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        self._plug(self._root_dev, f"{self._tag}R", None)
        _ip("addr", "add", f"{self.launcher_addr}/24", "dev", self._root_dev)
        _ip("link", "set", self._root_dev, "up")
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._ns.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
            dev = f"{self._tag}h{i}"
            self._plug(dev, f"{self._tag}S{i}", name)
            _ip("-n", name, "link", "set", dev, "name", IFACE)
            _ip("-n", name, "addr", "add", f"{self.host_addr(i)}/24", "dev", IFACE)
            _ip("-n", name, "link", "set", IFACE, "up")

    def _plug(self, dev: str, port: str, netns: str | None) -> None:
        """A veth ``dev`` (moved into ``netns``) whose peer ``port`` is on the bridge."""
        _ip("link", "add", dev, "type", "veth", "peer", "name", port)
        _ip("link", "set", port, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        if netns is not None:
            _ip("link", "set", dev, "netns", netns)

    @property
    def launcher_addr(self) -> str:
        return f"10.{self.net}.0.254"

    def host_addr(self, i: int) -> str:
        return f"10.{self.net}.0.{i + 1}"

    def mpi_agent(self, path: str) -> str:
        """Write at ``path`` the program Open MPI's mpirun starts its daemons with
        (``--mca plm_ssh_agent``, called as ``AGENT HOST COMMAND``, ssh's way): it runs
        COMMAND in HOST's namespace, under a hostname of its own (the namespaces share
        the machine's, and mpirun would take every daemon for one node); its path."""
        with open(path, "w") as f:
            f.write(
                "#!/bin/sh\n"
                "host=$1; shift\n"
                'exec ip netns exec "$host" unshare --uts /bin/sh -c '
                '\'hostname "$0" && eval "$1"\' "$host" "$*"\n'
            )
        os.chmod(path, 0o755)
        return path

    @property
    def subnet(self) -> str:
        """The switch's subnet (CIDR): every host's ``un0`` and the launcher's address."""
        return f"10.{self.net}.0.0/24"

    def shape(self, rate: str) -> None:
        """Limit every host's NIC (egress of its ``un0``) to ``rate`` with tbf."""
        for name in self.names:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    name,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    IFACE,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "256kb",
                    "latency",
                    "50ms",
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=20,
            )

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self._root_dev], capture_output=True, timeout=20)
        for name in reversed(self._ns):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        self._ns.clear()
