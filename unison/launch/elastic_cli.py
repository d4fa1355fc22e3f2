"""``unison run``'s elastic arguments (horovodrun's names) and the job they start
(:class:`~.elastic.ElasticDriver`)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .. import config as C
from ..elastic import Blacklist, FixedHosts, HostDiscovery, ScriptDiscovery
from ..errors import InvalidArgumentError, LaunchError
from ..store import TCPStoreServer
from .elastic import ElasticDriver
from .elastic_ps import PsElasticDriver
from .hosts import is_local, store_endpoint

__all__ = ["add_elastic_options", "is_elastic", "main", "run_elastic"]


def run_elastic(
    command: Sequence[str],
    *,
    discovery: HostDiscovery,
    np: int,
    min_np: int,
    max_np: int | None,
    elastic_timeout: float,
    reset_limit: int | None = None,
    cooldown_range: tuple[float, float] | None = None,
    env: Mapping[str, str] | None = None,
    store_addr: str | None = None,
    network_interface: str | None = None,
    servers: int = 0,
    **kwargs: object,
) -> int:
    """Run ``command`` as an elastic job; its exit status. With ``servers``, a parameter-
    server job (:class:`~.elastic_ps.PsElasticDriver`): the counts include the servers."""
    if not 1 <= min_np <= np or (max_np is not None and max_np < np):
        raise InvalidArgumentError(
            f"need 1 <= --min-np ({min_np}) <= -np ({np}) <= --max-np ({max_np})"
        )
    if servers and not 0 < servers < min_np:
        raise InvalidArgumentError(
            f"--servers {servers} with --min-np {min_np}: -np, --min-np and --max-np count "
            "every process, servers included, so --min-np must leave at least one worker"
        )
    blacklist = Blacklist(cooldown_range)
    first = discovery.find_available_hosts_and_slots()  # a broken script fails here
    remote = [h for h in first if not is_local(h)]
    advertised, bind = "127.0.0.1", ("127.0.0.1", 0)
    if remote or store_addr or network_interface:
        advertised, port = store_endpoint(
            store_addr, network_interface, remote[0] if remote else None
        )
        bind = ("0.0.0.0", port)
    secret = secrets.token_bytes(32)
    job_id = f"{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
    with TCPStoreServer(*bind, secret, max_connections=1024) as server:
        server.start()
        extra: dict[str, Any] = {"servers": servers} if servers else {}
        cls = PsElasticDriver if servers else ElasticDriver
        driver = cls(
            command,
            discovery=discovery,
            np=np,
            min_np=min_np,
            max_np=max_np,
            elastic_timeout=elastic_timeout,
            reset_limit=reset_limit,
            blacklist=blacklist,
            env=dict(os.environ if env is None else env),
            store=(advertised, server.address[1]),
            server=server,
            secret=secret,
            job_id=job_id,
            network_interface=network_interface,
            **extra,
            **kwargs,  # type: ignore[arg-type]
        )
        return driver.run()


def add_elastic_options(p: argparse.ArgumentParser) -> None:
    """horovodrun's elastic arguments."""
    g = p.add_argument_group("elastic arguments (horovodrun's)")
    g.add_argument(
        "--min-np",
        "--min_np",
        dest="min_np",
        type=int,
        default=None,
        metavar="N",
        help="fewest workers the job runs with; below it, it waits for slots "
        "(default: -np). Makes the job elastic",
    )
    g.add_argument(
        "--max-np",
        "--max_np",
        dest="max_np",
        type=int,
        default=None,
        metavar="N",
        help="most workers the job grows to (default: unbounded). Makes the job elastic",
    )
    g.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=int,
        default=1,
        metavar="N",
        help="slots of a host the discovery script lists without :N",
    )
    g.add_argument(
        "--host-discovery-script",
        default=None,
        metavar="SCRIPT",
        help="prints the available hosts, one 'host' or 'host:slots' per line; run "
        "every second. Makes the job elastic",
    )
    g.add_argument(
        "--elastic-timeout",
        type=float,
        default=None,
        metavar="S",
        help="how long to wait for --min-np slots, and workers for the next world "
        "(default 600; HOROVOD_ELASTIC_TIMEOUT)",
    )
    g.add_argument(
        "--reset-limit",
        type=int,
        default=None,
        metavar="N",
        help="most times the world may be re-formed before the job fails",
    )
    g.add_argument(
        "--blacklist-cooldown-range",
        type=float,
        nargs=2,
        default=None,
        metavar=("MIN", "MAX"),
        help="a failing host is blacklisted for MIN seconds, "
        "doubling per failure up to MAX (default: for good)",
    )


def is_elastic(args: argparse.Namespace) -> bool:
    return bool(args.min_np or args.max_np or args.host_discovery_script)


def main(
    args: argparse.Namespace,
    command: list[str],
    hosts: list[tuple[str, int]] | None,
    prefix: bool,
    env: Mapping[str, str],
    export: Sequence[str],
    rsh: str,
) -> int:
    """``unison run`` with elastic arguments."""
    discovery: HostDiscovery
    if args.host_discovery_script:
        if hosts:
            raise InvalidArgumentError("give either -H/--hostfile or --host-discovery-script")
        discovery = ScriptDiscovery(args.host_discovery_script, args.slots_per_host)
    else:
        slots = args.max_np or args.np or args.min_np
        discovery = FixedHosts(dict(hosts) if hosts else {"localhost": slots})
    np = args.np or args.min_np or 1
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", C.load_config().elastic_timeout))
    try:
        return _run(args, command, discovery, np, timeout, prefix, env, export, rsh)
    except LaunchError as exc:  # e.g. the discovery script failed on its first run
        print(f"unison run: {exc}", file=sys.stderr)
        return 1


def _run(
    args: argparse.Namespace,
    command: list[str],
    discovery: HostDiscovery,
    np: int,
    timeout: float,
    prefix: bool,
    env: Mapping[str, str],
    export: Sequence[str],
    rsh: str,
) -> int:
    return run_elastic(
        command,
        discovery=discovery,
        np=np,
        min_np=args.min_np or np,
        max_np=args.max_np,
        elastic_timeout=timeout,
        reset_limit=args.reset_limit,
        cooldown_range=tuple(args.blacklist_cooldown_range)
        if args.blacklist_cooldown_range
        else None,
        env=env,
        store_addr=args.store_addr,
        network_interface=args.network_interface,
        servers=args.servers or 0,
        rsh=rsh,
        export=export,
        prefix=prefix,
        timeout=args.timeout,
        job_timeout=args.job_timeout,
        start_timeout=args.start_timeout,
        verbose=args.verbose,
    )
