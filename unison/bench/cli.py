"""``unison bench``: sweep sizes for each operation on unison and, in the same run, its peers.

Every implementation runs as its own set of ``-np`` processes, one after the
other (never at the same time, so they do not share the cores): unison under
``unison run``'s launcher, Gloo through ``torch.distributed`` under the same
launcher, OpenMPI through ``mpirun`` and mpi4py. A peer that is not installed is
reported as skipped. As in nccl-tests, each row prints as soon as it is measured,
each implementation ends with its average bus bandwidth, and ``-b/-e/-f/-n/-w/-c``
mean what they mean there; a final table sets unison beside its peers.

Started by a launcher itself (``mpirun -np 2 unison bench --backend mpi``, ``srun``,
``unison run``), the processes of that job are the ranks measured, and rank 0 alone
prints. A machine whose load average says it is busy gets a warning first.
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
import threading
import time
from collections.abc import Callable
from typing import Any

from .._version import __version__, install_hint
from ..errors import InvalidArgumentError
from ..jobenv import usable_cores
from .report import legend, plot, row_header, row_line, summary_line, table, write_json
from .spec import DTYPES, LIST_OPS, OPS, BenchSpec, parse_size, parse_sizes

__all__ = ["busy", "configure_parser", "main", "run_impl"]

PEERS = ("gloo", "mpi")
DEFAULT_SIZES = "8:256M"
#: above this 1-minute load average per core, the figures measure the other work too
BUSY_LOAD_PER_CORE = 0.3


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-np", "--np", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument(
        "--ops",
        default="all_reduce",
        help=f"comma list of {','.join(OPS)} or all; also the list forms "
        f"{','.join(LIST_OPS)} (not in all)",
    )
    p.add_argument(
        "--sizes", default=None, help=f"lo:hi (times -f) or a list (default {DEFAULT_SIZES})"
    )
    p.add_argument("-b", "--minbytes", default=None, help="smallest size, as nccl-tests' -b")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size, as nccl-tests' -e")
    p.add_argument(
        "-f",
        "--stepfactor",
        "--step-factor",
        dest="step_factor",
        type=int,
        default=2,
        help="size multiplier in a range (nccl-tests' -f)",
    )
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("-n", "--iters", type=int, default=0, help="timed iterations (default: by size)")
    p.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup",
        dest="warmup",
        type=int,
        default=5,
        help="untimed iterations per size",
    )
    p.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        help="iterations checked against the expected result (nccl-tests' -c; 0: none)",
    )
    p.add_argument("--algo", default="", help="force unison algorithms (UNISON_ALGO syntax)")
    p.add_argument("--transport", default="", choices=["", "auto", "shm", "tcp"])
    p.add_argument(
        "--backend",
        default="native",
        choices=["native", "mpi", "torch"],
        help="engine under unison's API (mpi: ranks started by mpirun)",
    )
    p.add_argument("--compare", default="", help="peers to measure too: gloo,mpi")
    p.add_argument(
        "--mpi-mca",
        dest="mpi_mca",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an Open MPI MCA parameter for the mpi peer's mpirun (repeatable; e.g. "
        "btl_tcp_if_include=10.0.0.0/24, plm_ssh_agent=FILE to start its daemons on the "
        "-H hosts the way --rsh does); --transport tcp already holds it to pml ob1, btl tcp,self",
    )
    p.add_argument(
        "--no-check", dest="check", action="store_const", const=0, help="the same as -c 0"
    )
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
    show: Callable[[dict[str, Any]], None] | None = None,
    mpi_mca: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run one implementation's sweep; (rows, failure reason). ``placement``: the
    multi-host options of ``unison run`` (hosts, rsh, store_addr, network_interface);
    ``show`` is called with each row while the sweep runs, as rank 0 writes it;
    ``mpi_mca``: the MCA parameters of a job mpirun starts (:func:`mpi_mca`)."""
    with tempfile.TemporaryDirectory(prefix="unison-bench-") as tmp:
        out = os.path.join(tmp, "rows.jsonl")
        with _Follower(out, show):
            status = _launch(impl, spec, np_, env, timeout, placement, tmp, out, mpi_mca or {})
        if isinstance(status, str):
            return [], status
        if status in (130, -2):  # the job was interrupted (Ctrl-C): stop the whole sweep
            raise KeyboardInterrupt
        if status != 0 or not os.path.exists(out):
            return [], f"{impl} ranks exited with status {status}"
        import json

        with open(out) as f:
            return [json.loads(line) for line in f if line.strip()], None


class _Follower:
    """Reads the rows file while the ranks append to it and shows each whole line."""

    def __init__(self, path: str, show: Callable[[dict[str, Any]], None] | None) -> None:
        self.path, self.show = path, show
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-rows", daemon=True)

    def __enter__(self) -> _Follower:
        if self.show is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.show is not None:
            self.stop.set()
            self.thread.join()

    def _run(self) -> None:
        import json

        assert self.show is not None
        pos, pending = 0, b""
        while True:
            last = self.stop.is_set()  # read once more after the job ended, then stop
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
            except FileNotFoundError:
                chunk = b""
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    self.show(json.loads(line))
            if last:
                return
            self.stop.wait(0.1)


def _launch(
    impl: str,
    spec: BenchSpec,
    np_: int,
    env: dict[str, str],
    timeout: float,
    placement: dict[str, Any] | None,
    tmp: str,
    out: str,
    mca: dict[str, str],
) -> int | str:
    """Start one implementation's ranks and wait: their exit status, or why they timed out."""
    worker = [sys.executable, "-m", "unison.bench.worker", impl, spec.to_json(), out]
    hosts = (placement or {}).get("hosts")
    if impl == "mpi" or (impl == "unison" and env.get("UNISON_BACKEND") == "mpi"):
        mpirun = _mpirun()
        assert mpirun is not None
        cmd = [mpirun, "-np", str(np_)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        if hosts:
            # each host's slots as given; no --oversubscribe here: with it, mpirun places
            # every rank on the first host, whatever the slots say
            cmd += ["--host", ",".join(f"{name}:{slots}" for name, slots in hosts)]
        else:
            cmd.insert(1, "--oversubscribe")  # np may exceed this host's cores
        for key, value in mca.items():
            cmd += ["--mca", key, value]
        # the ranks' file store (else /tmp/unison-ompi-<job>) lives in our temp dir,
        # which is removed however the run ends
        env = {**env, "UNISON_STORE_PATH": os.path.join(tmp, "store")}
        try:
            return subprocess.run([*cmd, *worker, "0"], env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return f"{impl} timed out after {timeout:g} s"
    from ..launch.launcher import run_job

    if impl == "gloo" and not env.get("UNISON_BIND"):
        # Gloo's ranks as torchrun starts them: not bound to cores (unison run binds)
        env = {**env, "UNISON_BIND": "none"}
    # across hosts, Gloo's ranks meet through the launcher's store (port 0), not 127.0.0.1
    return run_job(
        [*worker, "0" if hosts else str(_free_port())],
        np_,
        env=env,
        prefix=False,
        job_timeout=timeout,
        **(placement or {}),
    )


def mpi_mca(
    env: dict[str, str], given: list[str], hosts: list[tuple[str, int]] | None
) -> dict[str, str]:
    """The MCA parameters of the mpi peer's mpirun: under ``UNISON_TRANSPORT=tcp`` Open
    MPI is held to TCP too (pml ob1, whose byte transfer layers are then only tcp and
    self: no shared memory, and no UCX, which would pick its own transports whatever
    ``btl`` says), over loopback on one host; then ``given`` (KEY=VALUE), which wins."""
    mca: dict[str, str] = {}
    if env.get("UNISON_TRANSPORT") == "tcp":
        mca.update(pml="ob1", btl="tcp,self")
        if not hosts:
            mca["btl_tcp_if_include"] = "lo"  # Open MPI leaves loopback out by default
    keys = set()
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"--mpi-mca takes KEY=VALUE, got {item!r}")
        keys.add(key.strip())
        mca[key.strip()] = value
    if "btl_tcp_if_exclude" in keys and "btl_tcp_if_include" not in keys:
        mca.pop("btl_tcp_if_include", None)  # Open MPI takes one of the two
    return mca


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


def busy(load1: float, cores: int) -> str | None:
    """A warning where the 1-minute load average says other work shares the cores."""
    if load1 <= cores * BUSY_LOAD_PER_CORE:
        return None
    return (
        f"unison bench: warning: this machine is busy (1-minute load average {load1:.2f} on "
        f"{cores} core{'s' * (cores != 1)}): its figures will measure the other work too; "
        "measure on a quiet machine"
    )


def _cores() -> int:
    return usable_cores()


def _sizes(args: argparse.Namespace) -> list[int]:
    """--sizes, or nccl-tests' -b/-e/-f range (a missing end takes the default's)."""
    if args.minbytes is None and args.maxbytes is None:
        return parse_sizes(args.sizes or DEFAULT_SIZES, args.step_factor)
    if args.sizes is not None:
        raise InvalidArgumentError("give --sizes or -b/-e, not both")
    lo_d, hi_d = (parse_size(t) for t in DEFAULT_SIZES.split(":"))
    lo = parse_size(args.minbytes) if args.minbytes is not None else None
    hi = parse_size(args.maxbytes) if args.maxbytes is not None else None
    lo = lo if lo is not None else min(lo_d, hi if hi is not None else lo_d)
    hi = hi if hi is not None else max(hi_d, lo)
    return parse_sizes(f"{lo}:{hi}", args.step_factor)


def _launched_rank() -> tuple[int, int] | None:
    """(rank, size) when this process is one rank of a job of several that a launcher
    started (mpirun, srun, torchrun, unison run); None when it runs on its own."""
    from ..jobenv import detect_job

    info = detect_job(secret=b"probe")  # rank and size only: no secret is derived
    return (info.rank, info.size) if info.size > 1 else None


def _main(args: argparse.Namespace) -> int:
    if args.plot:
        _plot_ready()
    if args.calibrate:
        from ..transport.calibrate import main as calibrate

        return calibrate(args)
    ops = OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS + LIST_OPS]
    if args.iters < 0 or args.warmup < 0 or args.check < 0 or args.timeout <= 0:
        raise InvalidArgumentError("-n/-w/-c must be >= 0 and --timeout > 0")
    if bad or args.np < 1:
        raise InvalidArgumentError(f"unknown operations {bad}" if bad else "-np must be >= 1")
    peers = [c.strip() for c in args.compare.split(",") if c.strip()]
    if any(c not in PEERS for c in peers):
        raise InvalidArgumentError(f"--compare takes {','.join(PEERS)}, got {args.compare!r}")
    spec = BenchSpec(
        ops=ops,
        sizes=tuple(_sizes(args)),
        dtype=args.dtype,
        iters=args.iters,
        warmup=args.warmup,
        check=args.check,
    )
    env = dict(os.environ)
    if args.algo:
        env["UNISON_ALGO"] = args.algo
    if args.transport:
        env["UNISON_TRANSPORT"] = args.transport
    env["UNISON_BACKEND"] = args.backend
    from ..launch.hosts import host_list

    hosts = host_list(args.hosts, args.hostfile)
    mca = mpi_mca(env, args.mpi_mca, hosts)
    launched = _launched_rank()
    leader = launched is None or launched[0] == 0
    load_before = os.getloadavg()
    warning = busy(load_before[0], _cores())
    if warning and leader:
        print(warning, file=sys.stderr, flush=True)
    np_ = launched[1] if launched else args.np
    meta: dict[str, Any] = {
        "unison": __version__,
        "np": np_,
        "dtype": args.dtype,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "algo": args.algo,
        "backend": args.backend,
        "transport": env.get("UNISON_TRANSPORT", "auto"),
        "load_before": load_before,
        "busy": warning is not None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "skipped": {},
    }
    if "mpi" in peers or args.backend == "mpi":
        meta["mpi_mca"] = mca

    def show(row: dict[str, Any]) -> None:
        print(row_line(row), flush=True)

    rows: list[dict[str, Any]] = []
    ran: list[str] = []
    if launched is not None:
        rows, ran = _in_this_job(spec, env, peers, meta, show if leader else None)
        if not leader:
            return 0
    else:
        rows, ran = _sweep_each(args, spec, env, ["unison", *peers], meta, show, mca)
    meta["load_after"] = os.getloadavg()
    ran_peers = [i for i in ran if i != "unison"]
    if ran_peers:
        print(f"\n# unison against its peers (np={np_}, {args.dtype})")
        print(table(rows, ran, np_))
        print(legend(ran_peers))
    print(
        f"# load average before/after: {meta['load_before'][0]:.2f} / {meta['load_after'][0]:.2f}"
    )
    if args.json:
        write_json(args.json, meta, rows)
    if args.plot:
        plot(args.plot, rows, ran, np_)
    wrong = [r for r in rows if r.get("correct") is False]
    for r in wrong:
        print(
            f"WRONG RESULT: {r['impl']} {r['op']} {r['size']}B: {r.get('error')}", file=sys.stderr
        )
    return 1 if wrong or "unison" not in ran else 0


def _sweep_each(
    args: argparse.Namespace,
    spec: BenchSpec,
    env: dict[str, str],
    impls: list[str],
    meta: dict[str, Any],
    show: Callable[[dict[str, Any]], None],
    mca: dict[str, str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each implementation on its own ``-np`` ranks, one after the other (over ``-H``
    hosts too: Gloo under ``unison run``'s launcher, Open MPI's daemons started through
    ssh or, for another ``--rsh``, the ``plm_ssh_agent`` given with ``--mpi-mca``)."""
    from ..launch.hosts import DEFAULT_RSH, host_list

    rows: list[dict[str, Any]] = []
    ran: list[str] = []
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
        if (
            why is None
            and impl == "mpi"
            and hosts is not None
            and args.rsh != DEFAULT_RSH
            and "plm_ssh_agent" not in mca
        ):
            why = (
                f"mpirun starts its daemons with ssh, not --rsh {args.rsh!r}: give "
                "--mpi-mca plm_ssh_agent=FILE (FILE HOST COMMAND runs COMMAND on HOST)"
            )
        if why is None:
            print(row_header(impl, args.np, args.dtype), flush=True)
            got, why = run_impl(impl, spec, args.np, env, args.timeout, placement, show, mca)
            rows += got
        if why is not None:
            meta["skipped"][impl] = why
            print(f"unison bench: {impl} skipped: {why}", file=sys.stderr)
        else:
            ran.append(impl)
            print(summary_line(rows, impl), flush=True)
    return rows, ran


def _in_this_job(
    spec: BenchSpec,
    env: dict[str, str],
    peers: list[str],
    meta: dict[str, Any],
    show: Callable[[dict[str, Any]], None] | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """This process is one rank of a launched job: measure unison on that job's ranks,
    in this process; only rank 0 (``show`` set) prints."""
    from .worker import sweep

    for key in ("UNISON_ALGO", "UNISON_TRANSPORT", "UNISON_BACKEND"):
        if key in env:
            os.environ[key] = env[key]
    for impl in peers:
        meta["skipped"][impl] = (
            "peers run only when unison bench starts the ranks itself (without a launcher)"
        )
        if show is not None:
            print(f"unison bench: {impl} skipped: {meta['skipped'][impl]}", file=sys.stderr)
    if show is not None:
        print(row_header("unison", meta["np"], meta["dtype"]), flush=True)
    rows = sweep("unison", spec, 0, show)
    if show is not None:
        print(summary_line(rows, "unison"), flush=True)
    return rows, ["unison"]
