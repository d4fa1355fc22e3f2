"""``unison bench``: sweep sizes for each operation on unison and, in the same run, its peers.

Every implementation runs as its own set of ``-np`` processes, one after the
other (never at the same time, so they do not share the cores): unison under
``unison run``'s launcher, Gloo through ``torch.distributed`` under the same
launcher, OpenMPI through ``mpirun`` and mpi4py. A peer that is not installed is
reported as skipped. The table has one block per operation with time, algbw
and busbw per implementation and unison's busbw divided by each peer's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from .._version import __version__, install_hint
from ..errors import InvalidArgumentError
from .report import plot, table, write_json
from .spec import DTYPES, OPS, BenchSpec, parse_sizes

__all__ = ["configure_parser", "main", "run_impl"]

PEERS = ("gloo", "mpi")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-np", "--np", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--ops", default="all_reduce", help=f"comma list of {','.join(OPS)} or all")
    p.add_argument("--sizes", default="8:256M", help="range lo:hi (x step factor) or list")
    p.add_argument("--step-factor", type=int, default=2, help="size multiplier in a range")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--iters", type=int, default=0, help="timed iterations (default: by size)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument("--algo", default="", help="force unison algorithms (UNISON_ALGO syntax)")
    p.add_argument("--transport", default="", choices=["", "auto", "shm", "tcp"])
    p.add_argument(
        "--backend",
        default="native",
        choices=["native", "mpi", "torch"],
        help="engine under unison's API (mpi: ranks started by mpirun)",
    )
    p.add_argument("--compare", default="", help="peers to measure too: gloo,mpi")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--json", default="", help="write every row and the run's context here")
    p.add_argument("--plot", default="", help="draw busbw and latency vs size (PNG)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per implementation")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this host's link model (α, β, per-call overhead) and cache it",
    )
    from ..launch.hosts import add_host_options

    add_host_options(p)  # -H/--hostfile/--rsh/--store-addr/--network-interface, as unison run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mpirun() -> str | None:
    here = os.path.dirname(sys.executable)
    return shutil.which("mpirun", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def missing(impl: str) -> str | None:
    """Why a peer cannot run here (None when it can)."""
    if impl == "gloo" and importlib.util.find_spec("torch") is None:
        return f"torch is not installed ({install_hint('torch')})"
    if impl == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return f"mpi4py is not installed ({install_hint('mpi')})"
        if _mpirun() is None:
            return f"mpirun not found ({install_hint('mpi')})"
    return None


def run_impl(
    impl: str,
    spec: BenchSpec,
    np_: int,
    env: dict[str, str],
    timeout: float,
    placement: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run one implementation's sweep; (rows, failure reason). ``placement``: the
    multi-host options of ``unison run`` (hosts, rsh, store_addr, network_interface)."""
    with tempfile.TemporaryDirectory(prefix="unison-bench-") as tmp:
        out = os.path.join(tmp, "rows.jsonl")
        worker = [sys.executable, "-m", "unison.bench.worker", impl, spec.to_json(), out]
        if impl == "mpi" or (impl == "unison" and env.get("UNISON_BACKEND") == "mpi"):
            mpirun = _mpirun()
            assert mpirun is not None
            cmd = [mpirun, "--oversubscribe", "-np", str(np_)]
            if os.geteuid() == 0:
                cmd.insert(1, "--allow-run-as-root")
            # the ranks' file store (else /tmp/unison-ompi-<job>) lives in our temp dir,
            # which is removed however the run ends
            env = {**env, "UNISON_STORE_PATH": os.path.join(tmp, "store")}
            try:
                status = subprocess.run([*cmd, *worker, "0"], env=env, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                return [], f"{impl} timed out after {timeout:g} s"
        else:
            from ..launch.launcher import run_job

            status = run_job(
                [*worker, str(_free_port())],
                np_,
                env=env,
                prefix=False,
                job_timeout=timeout,
                **(placement or {}),
            )
        if status in (130, -2):  # the job was interrupted (Ctrl-C): stop the whole sweep
            raise KeyboardInterrupt
        if status != 0 or not os.path.exists(out):
            return [], f"{impl} ranks exited with status {status}"
        import json

        with open(out) as f:
            return [json.loads(line) for line in f if line.strip()], None


def main(args: argparse.Namespace) -> int:
    """Run the sweep; bad arguments exit 2 with a usage line, Ctrl-C stops every run (130)."""
    try:
        return _main(args)
    except InvalidArgumentError as exc:
        print(f"unison bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("unison bench: interrupted; the sweep stopped", file=sys.stderr)
        return 130


def _plot_ready() -> None:
    """Fail before the sweep, not after it, when ``--plot`` cannot draw."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InvalidArgumentError(f"--plot needs matplotlib ({install_hint('bench')})")


def _main(args: argparse.Namespace) -> int:
    if args.plot:
        _plot_ready()
    if args.calibrate:
        from ..transport.calibrate import main as calibrate

        return calibrate(args)
    ops = OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if args.iters < 0 or args.warmup < 0 or args.timeout <= 0:
        raise InvalidArgumentError("--iters/--warmup must be >= 0 and --timeout > 0")
    if bad or args.np < 1:
        raise InvalidArgumentError(f"unknown operations {bad}" if bad else "-np must be >= 1")
    peers = [c.strip() for c in args.compare.split(",") if c.strip()]
    if any(c not in PEERS for c in peers):
        raise InvalidArgumentError(f"--compare takes {','.join(PEERS)}, got {args.compare!r}")
    spec = BenchSpec(
        ops=ops,
        sizes=tuple(parse_sizes(args.sizes, args.step_factor)),
        dtype=args.dtype,
        iters=args.iters,
        warmup=args.warmup,
        check=not args.no_check,
    )
    env = dict(os.environ)
    if args.algo:
        env["UNISON_ALGO"] = args.algo
    if args.transport:
        env["UNISON_TRANSPORT"] = args.transport
    env["UNISON_BACKEND"] = args.backend
    meta: dict[str, Any] = {
        "unison": __version__,
        "np": args.np,
        "dtype": args.dtype,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "algo": args.algo,
        "backend": args.backend,
        "transport": env.get("UNISON_TRANSPORT", "auto"),
        "load_before": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "skipped": {},
    }
    rows: list[dict[str, Any]] = []
    impls = ["unison", *peers]
    ran = []
    from ..launch.hosts import host_list

    hosts = host_list(args.hosts, args.hostfile)
    placement: dict[str, Any] = {}
    if hosts is not None:
        placement = {
            "hosts": hosts,
            "rsh": args.rsh,
            "store_addr": args.store_addr,
            "network_interface": args.network_interface,
        }
        meta["hosts"] = hosts
    for impl in impls:
        why = missing(impl)
        if why is None and hosts is not None and impl != "unison":
            why = "peers are measured on one host only (no -H for gloo/mpi yet)"
        if why is None:
            got, why = run_impl(impl, spec, args.np, env, args.timeout, placement)
            rows += got
        if why is not None:
            meta["skipped"][impl] = why
            print(f"unison bench: {impl} skipped: {why}", file=sys.stderr)
        else:
            ran.append(impl)
    meta["load_after"] = os.getloadavg()
    print(table(rows, ran, args.np))
    print(f"load average before/after: {meta['load_before'][0]:.2f} / {meta['load_after'][0]:.2f}")
    if args.json:
        write_json(args.json, meta, rows)
    if args.plot:
        plot(args.plot, rows, ran, args.np)
    wrong = [r for r in rows if r.get("correct") is False]
    for r in wrong:
        print(
            f"WRONG RESULT: {r['impl']} {r['op']} {r['size']}B: {r.get('error')}", file=sys.stderr
        )
    return 1 if wrong or "unison" not in ran else 0
