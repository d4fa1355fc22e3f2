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

import os
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError

__all__ = [
    "DEFAULT_RSH",
    "Slot",
    "allocate",
    "forwarded_environment",
    "is_local",
    "parse_hostfile",
    "parse_hosts",
    "remote_argv",
]

DEFAULT_RSH = "ssh -o BatchMode=yes {host}"


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
    """Lines ``host [slots=N]`` or ``host:N`` (``max_slots=`` and ``#`` comments are
    ignored)."""
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
        host, sep, count = words[0].rpartition(":")
        if sep and count.isdigit() and host and ":" not in host:
            words[0], slots = host, int(count)  # "host:N", as in -H
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


def allocate(hosts: Sequence[tuple[str, int]], np: int, oversubscribe: bool = False) -> list[Slot]:
    """Fill hosts in order; every host that gets a rank counts in cross_size. With
    ``oversubscribe`` the ranks beyond the slots go round the hosts one each (a host's
    ranks stay contiguous)."""
    total = sum(n for _, n in hosts)
    if np > total and not oversubscribe:
        listed = ",".join(f"{h}:{n}" for h, n in hosts)
        raise InvalidArgumentError(
            f"-np {np} is more than the {total} slots of the hosts ({listed}); "
            "add --oversubscribe to run more ranks than slots"
        )
    counts = [0] * len(hosts)
    left = np
    for i, (_, n) in enumerate(hosts):
        counts[i] = min(n, left)
        left -= counts[i]
    i = 0
    while left > 0:
        counts[i % len(hosts)] += 1
        left -= 1
        i += 1
    per_host = [(h, c) for (h, _), c in zip(hosts, counts, strict=True) if c]
    slots: list[Slot] = []
    for cross, (host, n) in enumerate(per_host):
        for local in range(n):
            slots.append(Slot(len(slots), host, local, n, cross, len(per_host)))
    return slots


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (its ranks start without the remote shell)."""
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


#: launcher variables a remote rank does not get: they describe this host or this
#: login session (``-x NAME`` forwards one of them anyway)
DENY_EXACT = frozenset(
    "HOSTNAME HOST HOME USER LOGNAME SHELL PWD OLDPWD SHLVL _ DISPLAY XAUTHORITY TERM "
    "TERMCAP COLUMNS LINES TMPDIR TMP TEMP MAIL LS_COLORS KRB5CCNAME "
    "DBUS_SESSION_BUS_ADDRESS WINDOWID TMUX TMUX_PANE STY".split()
)
DENY_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_", "GPG_", "SUDO_")


def forwarded_environment(env: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """What a remote rank receives of ``env``: all but the deny-list, plus ``extra``
    (``-x NAME``: forward it even if denied)."""
    keep = set(extra)
    return {
        k: v
        for k, v in env.items()
        if k in keep or not (k in DENY_EXACT or k.startswith(DENY_PREFIXES))
    }


def _agent_takes_one_string(words: Sequence[str]) -> bool:
    """ssh-like agents join their arguments and hand them to a shell: give one string."""
    return bool(words) and os.path.basename(words[0]) in ("ssh", "rsh", "oarsh", "pdsh")


def remote_argv(template: str, host: str) -> list[str]:
    """The local command that starts the remote wrapper (:mod:`unison.launch.remote`)
    on ``host``. Nothing job-specific is on it: the rank's command, environment,
    working directory and the job secret go to the wrapper on its stdin."""
    if "{host}" not in template:
        raise InvalidArgumentError(f"--rsh {template!r} must contain {{host}}")
    inner = [sys.executable, "-m", "unison.launch.remote"]
    path = os.environ.get("PYTHONPATH")
    if path:  # the wrapper must import unison before it can set anything up
        inner = ["env", f"PYTHONPATH={path}", *inner]
    words = shlex.split(template)
    if any("{command}" in w for w in words):
        quoted = shlex.join(inner)
        return [w.replace("{host}", host).replace("{command}", quoted) for w in words]
    words = [w.replace("{host}", host) for w in words]
    if _agent_takes_one_string(words):
        return [*words, shlex.join(inner)]
    return words + inner


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
        help="a file of lines 'host slots=N' (Open MPI's format) or 'host:N'",
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
        "-p",
        "--ssh-port",
        type=int,
        default=None,
        metavar="PORT",
        help="ssh port on every host (horovodrun's -p)",
    )
    p.add_argument(
        "-i",
        "--ssh-identity-file",
        default=None,
        metavar="FILE",
        help="ssh private key to log in with (horovodrun's -i)",
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
        "--iface",
        dest="network_interface",
        default=None,
        metavar="IFACE",
        help="the interface ranks talk over (UNISON_NETWORK_INTERFACE); also picks "
        "the store's address when --store-addr is not given",
    )


def ssh_template(rsh: str, port: int | None, identity: str | None) -> str:
    """``--rsh`` with horovodrun's ``-p``/``-i`` added (only to the default ssh agent)."""
    if port is None and identity is None:
        return rsh
    if rsh != DEFAULT_RSH:
        raise InvalidArgumentError(
            "-p/--ssh-port and -i/--ssh-identity-file go with ssh, not --rsh"
        )
    extra = ([f"-p {port}"] if port is not None else []) + (
        [f"-i {shlex.quote(identity)}"] if identity else []
    )
    return DEFAULT_RSH.replace("{host}", " ".join([*extra, "{host}"]))


def host_list(hosts: str | None, hostfile: str | None) -> list[tuple[str, int]] | None:
    if hosts is not None:
        return parse_hosts(hosts)
    if hostfile is not None:
        return parse_hostfile(hostfile)
    return None


def store_endpoint(
    store_addr: str | None, interface: str | None, first_remote: str | None = None
) -> tuple[str, int]:
    """(address the ranks connect to, port to listen on; 0: any) for a multi-host job."""
    if store_addr:
        host, sep, port = store_addr.rpartition(":")
        if sep and port.isdigit() and host and ":" not in host:
            return host, int(port)
        return store_addr, 0
    if first_remote is not None:  # the interface names the ranks' NIC, maybe not ours
        return route_address(first_remote), 0
    if interface:
        from ..bootstrap import advertise_address

        return advertise_address(None, interface), 0
    try:
        return socket.gethostbyname(socket.getfqdn()), 0
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot find this host's address for the store ({exc}); give --store-addr"
        ) from None


def route_address(host: str) -> str:
    """This host's address on the route to ``host`` (what the kernel would send from)."""
    try:
        infos = socket.getaddrinfo(host, 22, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot resolve host {host!r} ({exc}); give --store-addr"
        ) from None
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect(addr)  # UDP: no packet is sent, only the route is looked up
                local = str(s.getsockname()[0])
            except OSError:
                continue
            if not local.startswith("127."):
                return local
    raise InvalidArgumentError(
        f"no route from this host to {host!r} for the store; give --store-addr"
    )
