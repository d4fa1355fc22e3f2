"""Where the ranks of a multi-host job run, and how a rank is started on a remote host.

``-H hostA:4,hostB:4`` and ``--hostfile FILE`` (lines ``host slots=N``, ``#`` comments,
as Open MPI's hostfiles) give the hosts in order with their slots. Ranks fill hosts in
that order, each host up to its slots (``-np`` below the total leaves the last slots
empty, above it is an error), so the ranks of one host are contiguous — what
hierarchical collectives and Horovod's ``local_rank``/``cross_rank`` assume.

A rank on a host other than this one starts through the remote-shell template
(``--rsh``, default ``ssh -o BatchMode=yes {host}``, as ``mpirun``'s
``plm_rsh_agent``). ``{host}`` is replaced by the host name. The rank's job
environment travels on the command line through ``env K=V ...`` (ssh forwards no
environment); when the template contains ``{command}`` it is replaced by the whole
command as one shell-quoted string (for agents that run a shell), otherwise the
command's words are appended as separate arguments (``ip netns exec {host}``,
``docker exec {host}``, and ssh, which joins its arguments with spaces itself).
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError

__all__ = [
    "DEFAULT_RSH",
    "Slot",
    "allocate",
    "is_local",
    "parse_hostfile",
    "parse_hosts",
    "remote_argv",
]

DEFAULT_RSH = "ssh -o BatchMode=yes {host}"

#: variables a remote rank must receive (prefixes); the rest of the launcher's
#: environment stays on this host
FORWARD_PREFIXES = ("UNISON_", "HOROVOD_", "PYTHON")


@dataclass(frozen=True)
class Slot:
    """Where one rank runs and its place there (Horovod's meaning of local/cross)."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """``"a:4,b:4"`` (a host without ``:N`` has one slot) -> ``[("a", 4), ("b", 4)]``."""
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep:
            host, count = item, "1"
        try:
            slots = int(count)
        except ValueError:
            raise InvalidArgumentError(
                f"-H: {item!r} is not host or host:slots (e.g. -H node1:4,node2:4)"
            ) from None
        _add(out, host, slots, f"-H {item!r}")
    if not out:
        raise InvalidArgumentError("-H: no hosts given (e.g. -H node1:4,node2:4)")
    return out


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """Lines ``host [slots=N]`` (``max_slots=`` and ``#`` comments are ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise InvalidArgumentError(f"--hostfile {path}: {exc.strerror or exc}") from None
    out: list[tuple[str, int]] = []
    for no, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "slot"):
                try:
                    slots = int(value)
                except ValueError:
                    raise InvalidArgumentError(
                        f"--hostfile {path}:{no}: slots must be an integer, got {value!r}"
                    ) from None
            elif key != "max_slots":
                raise InvalidArgumentError(
                    f"--hostfile {path}:{no}: unknown field {word!r} (expected slots=N)"
                )
        _add(out, words[0], slots, f"--hostfile {path}:{no}")
    if not out:
        raise InvalidArgumentError(f"--hostfile {path}: no hosts in it")
    return out


def _add(out: list[tuple[str, int]], host: str, slots: int, where: str) -> None:
    if not host:
        raise InvalidArgumentError(f"{where}: empty host name")
    if slots < 1:
        raise InvalidArgumentError(f"{where}: slots must be >= 1, got {slots}")
    for i, (h, n) in enumerate(out):
        if h == host:  # a host named twice adds its slots, as in Open MPI
            out[i] = (h, n + slots)
            return
    out.append((host, slots))


def allocate(hosts: Sequence[tuple[str, int]], np: int) -> list[Slot]:
    """Fill hosts in order; every host that gets a rank counts in cross_size."""
    total = sum(n for _, n in hosts)
    if np > total:
        listed = ",".join(f"{h}:{n}" for h, n in hosts)
        raise InvalidArgumentError(
            f"-np {np} is more than the {total} slots of the hosts ({listed})"
        )
    per_host: list[tuple[str, int]] = []
    left = np
    for host, n in hosts:
        take = min(n, left)
        if take:
            per_host.append((host, take))
        left -= take
    slots: list[Slot] = []
    for cross, (host, n) in enumerate(per_host):
        for local in range(n):
            slots.append(Slot(len(slots), host, local, n, cross, len(per_host)))
    return slots


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (its ranks start without the remote shell)."""
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def remote_argv(
    template: str, host: str, command: Sequence[str], env: Mapping[str, str]
) -> list[str]:
    """The local command that starts ``command`` on ``host`` with the job's ``env``."""
    if "{host}" not in template:
        raise InvalidArgumentError(f"--rsh {template!r} must contain {{host}}")
    forwarded = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(FORWARD_PREFIXES)]
    inner = ["env", *forwarded, *command]
    words = shlex.split(template)
    if any("{command}" in w for w in words):
        quoted = shlex.join(inner)
        return [w.replace("{host}", host).replace("{command}", quoted) for w in words]
    return [w.replace("{host}", host) for w in words] + inner


def add_host_options(p: object) -> None:
    """``unison run``'s multi-host options (on an argparse parser)."""
    import argparse

    assert isinstance(p, argparse.ArgumentParser)
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "-H",
        "--hosts",
        dest="hosts",
        default=None,
        metavar="HOST:N,...",
        help="hosts and their slots, filled in order (e.g. -H node1:4,node2:4)",
    )
    where.add_argument(
        "--hostfile",
        default=None,
        metavar="FILE",
        help="a file of lines 'host slots=N' (Open MPI's format)",
    )
    p.add_argument(
        "--rsh",
        default=DEFAULT_RSH,
        metavar="TEMPLATE",
        help="how to start a rank on another host; {host} is replaced, {command} too "
        f"if present, else the command is appended (default: {DEFAULT_RSH!r}; e.g. "
        "'ip netns exec {host}')",
    )
    p.add_argument(
        "--store-addr",
        default=None,
        metavar="ADDR[:PORT]",
        help="the address every host reaches the launcher's rendezvous store at "
        "(default: this host's address on --network-interface, else its hostname's)",
    )
    p.add_argument(
        "--network-interface",
        default=None,
        metavar="IFACE",
        help="the interface ranks talk over (UNISON_NETWORK_INTERFACE); also picks "
        "the store's address when --store-addr is not given",
    )


def host_list(hosts: str | None, hostfile: str | None) -> list[tuple[str, int]] | None:
    if hosts is not None:
        return parse_hosts(hosts)
    if hostfile is not None:
        return parse_hostfile(hostfile)
    return None


def store_endpoint(store_addr: str | None, interface: str | None) -> tuple[str, int]:
    """(address the ranks connect to, port to listen on; 0: any) for a multi-host job."""
    if store_addr:
        host, sep, port = store_addr.rpartition(":")
        if sep and port.isdigit() and host and ":" not in host:
            return host, int(port)
        return store_addr, 0
    if interface:
        from ..bootstrap import advertise_address

        return advertise_address(None, interface), 0
    try:
        return socket.gethostbyname(socket.getfqdn()), 0
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot find this host's address for the store ({exc}); give --store-addr"
        ) from None
