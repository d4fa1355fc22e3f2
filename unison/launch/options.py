"""``unison run``'s command-line options: mpirun's, horovodrun's and torchrun's names
with their meanings (see docs/launching.md and docs/porting.md)."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence

from ..errors import InvalidArgumentError
from .elastic_cli import add_elastic_options
from .habits import add_habit_options
from .hosts import add_host_options

__all__ = ["configure_parser", "free_port", "parse_exports", "resolve_np", "stdin_ranks"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-np",
        "-n",
        "--np",
        dest="np",
        type=int,
        default=None,
        metavar="N",
        help="number of ranks (on this host, or spread over -H/--hostfile hosts); "
        "default: --nproc-per-node x --nnodes",
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=int,
        default=None,
        metavar="N",
        help="ranks per host (torchrun); with -H each host gets N slots",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=None,
        metavar="M",
        help="number of hosts (torchrun); -np defaults to M x --nproc-per-node; with -H, "
        "the first M hosts are used",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="default deadline of every blocking call in the ranks (UNISON_TIMEOUT)",
    )
    p.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        metavar="S",
        help="wall-clock limit of the whole job; ends it with exit status 124",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        metavar="S",
        help="how long remote hosts may take to start and reach the store (horovodrun's "
        "--start-timeout; default 30)",
    )
    p.add_argument(
        "--servers",
        type=int,
        default=0,
        metavar="S",
        help="parameter-server processes among the N ranks: the last S ranks "
        "(UNISON_NUM_SERVERS, UNISON_ROLE; see unison.ps)",
    )
    p.add_argument(
        "-x",
        dest="export",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="export NAME (as it is here) or NAME=VALUE to every rank (mpirun's -x); repeatable",
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more ranks than the hosts' slots (mpirun's --oversubscribe)",
    )
    p.add_argument(
        "--stdin",
        default="0",
        metavar="none|all|RANK",
        help="which ranks read the launcher's stdin, on any host (mpirun's default: "
        "rank 0; 'all': each gets a copy); the others read /dev/null",
    )
    p.add_argument(
        "--output-filename",
        default=None,
        metavar="DIR",
        help="also write each rank's output to DIR/1/rank.N/stdout and stderr (mpirun)",
    )
    prefix = p.add_mutually_exclusive_group()
    prefix.add_argument(
        "--tag-output",
        dest="prefix",
        action="store_true",
        default=None,
        help="prefix each output line with [rank] (the default; UNISON_PREFIX_OUTPUT)",
    )
    prefix.add_argument(
        "--no-prefix",
        "--no-tag-output",
        dest="prefix",
        action="store_false",
        help="do not prefix output lines with [rank] (or UNISON_PREFIX_OUTPUT=0)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print where each rank starts and the command used (never the job secret)",
    )
    add_host_options(p)
    add_elastic_options(p)
    add_habit_options(p)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the command every rank runs (after an optional --)",
    )


def resolve_np(args: argparse.Namespace, hosts: list[tuple[str, int]] | None) -> int:
    for flag, value in (("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes)):
        if value is not None and value < 1:
            raise InvalidArgumentError(f"{flag} must be >= 1, got {value}")
    if args.nnodes and args.nnodes > 1 and not hosts:
        raise InvalidArgumentError(f"--nnodes {args.nnodes} needs the hosts: give -H or --hostfile")
    if args.np is not None:
        if args.np < 1:
            raise InvalidArgumentError(f"-np must be >= 1, got {args.np}")
        return int(args.np)
    if args.nproc_per_node:
        nodes = args.nnodes or (len(hosts) if hosts else 1)
        return int(args.nproc_per_node) * nodes
    raise InvalidArgumentError("give the number of ranks: -np N (or --nproc-per-node N)")


def parse_exports(items: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``-x NAME=VALUE`` -> set for every rank; ``-x NAME`` -> forward NAME as it is here."""
    values: dict[str, str] = {}
    names: list[str] = []
    for item in items:
        name, sep, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or "\0" in item:
            raise InvalidArgumentError(f"-x {item!r}: expected NAME or NAME=VALUE")
        names.append(name)
        if sep:
            values[name] = value
    return values, names


def stdin_ranks(spec: str, np: int) -> frozenset[int]:
    if spec == "none":
        return frozenset()
    if spec == "all":
        return frozenset(range(np))
    if spec.isdigit() and int(spec) < np:
        return frozenset({int(spec)})
    raise InvalidArgumentError(f"--stdin must be none, all or a rank in 0..{np - 1}, got {spec!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for torchrun's MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return int(s.getsockname()[1])
