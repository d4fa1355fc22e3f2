"""horovodrun's and mpirun's flags that ``unison run`` accepts for what they mean here.

Each flag either sets the ``UNISON_*`` variable the engine reads (``--fusion-threshold-mb``
-> ``UNISON_FUSION_THRESHOLD``, ...), is accepted with one line saying why it changes
nothing, or is refused naming what to do instead. A command that is a ``.py`` file runs
with this interpreter (torchrun's habit: ``unison run -np 2 train.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence

from ..errors import InvalidArgumentError

__all__ = ["add_habit_options", "habit_environment", "python_command"]

_LOG_LEVELS = {  # Horovod's levels -> Python logging's
    "TRACE": "DEBUG",
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "ERROR": "ERROR",
    "FATAL": "CRITICAL",
    "CRITICAL": "CRITICAL",
}
#: Open MPI parameters that name the interface to talk over
_MCA_INTERFACE = ("btl_tcp_if_include", "oob_tcp_if_include")
_MPI_INSTEAD = (
    "unison run starts the native and torch engines' ranks; for unison's MPI engine start "
    "the job with mpirun: mpirun -np N -x UNISON_BACKEND=mpi python SCRIPT"
)


def _level(text: str) -> str:
    level = _LOG_LEVELS.get(text.strip().upper())
    if level is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(lvl.lower() for lvl in _LOG_LEVELS)}"
        )
    return level


def add_habit_options(p: argparse.ArgumentParser) -> None:
    """horovodrun's tuning, timeline, stall-check and controller flags; mpirun's
    ``--host``, ``--bind-to``, ``--map-by``, ``--mca``. argparse matches a single-dash
    word by prefix, so no two single-dash flags may share their first letter after the
    dash (``python -m`` in the command would be ambiguous): ``--map-by`` has none."""
    h = p.add_argument_group("horovodrun's tuning flags (set the UNISON_* variables)")
    h.add_argument(
        "--timeline-filename",
        default=None,
        metavar="FILE",
        help="write a Chrome-trace timeline of unison.torch's operations on rank 0 "
        "(UNISON_TIMELINE)",
    )
    h.add_argument(
        "--timeline-mark-cycles",
        action="store_true",
        help="mark negotiation cycles in the timeline (UNISON_TIMELINE_MARK_CYCLES)",
    )
    h.add_argument(
        "--log-level",
        type=_level,
        default=None,
        metavar="LEVEL",
        help="level of the ranks' unison log: trace, debug, info, warning, error, fatal "
        "(UNISON_LOG_LEVEL)",
    )
    h.add_argument(
        "--fusion-threshold-mb",
        type=float,
        default=None,
        metavar="MB",
        help="fuse ready all-reduces up to this many MiB (UNISON_FUSION_THRESHOLD)",
    )
    h.add_argument(
        "--cycle-time-ms",
        type=float,
        default=None,
        metavar="MS",
        help="wait this long for more tensors before negotiating (UNISON_CYCLE_TIME)",
    )
    h.add_argument(
        "--cache-capacity",
        type=int,
        default=None,
        metavar="N",
        help="response cache entries; 0 disables it (UNISON_CACHE_CAPACITY)",
    )
    h.add_argument(
        "--no-stall-check",
        action="store_true",
        help="disable the stall inspector (UNISON_STALL_CHECK_DISABLE)",
    )
    h.add_argument(
        "--stall-check-warning-time-seconds",
        type=float,
        default=None,
        metavar="S",
        help="warn about tensors missing on some ranks after S seconds "
        "(UNISON_STALL_CHECK_TIME_SECONDS)",
    )
    h.add_argument(
        "--stall-check-shutdown-time-seconds",
        type=float,
        default=None,
        metavar="S",
        help="fail stalled tensors on every rank after S seconds "
        "(UNISON_STALL_SHUTDOWN_TIME_SECONDS)",
    )
    h.add_argument(
        "--network-interfaces",
        default=None,
        metavar="IF[,IF]",
        help="horovodrun's spelling of --network-interface (unison uses the first one)",
    )
    h.add_argument(
        "--gloo",
        action="store_true",
        help="accepted: unison's own engine plays the part of Horovod's Gloo controller",
    )
    h.add_argument("--mpi", action="store_true", help="refused: " + _MPI_INSTEAD)
    h.add_argument("--jsrun", action="store_true", help="refused: " + _MPI_INSTEAD)
    h.add_argument(
        "--check-build",
        "-cb",
        action="store_true",
        help="refused: `unison info` shows what this installation can do",
    )
    said = p.add_argument_group("horovodrun flags accepted with nothing to do here")
    said.add_argument("--disable-cache", action="store_true", help="unison run keeps no cache")
    said.add_argument("--hierarchical-allreduce", action="store_true", help=argparse.SUPPRESS)
    said.add_argument("--hierarchical-allgather", action="store_true", help=argparse.SUPPRESS)
    said.add_argument("--autotune", action="store_true", help=argparse.SUPPRESS)
    for flag in (
        "--autotune-log-file",
        "--autotune-warmup-samples",
        "--autotune-steps-per-sample",
        "--autotune-bayes-opt-max-samples",
        "--autotune-gaussian-process-noise",
        "--mpi-args",
    ):
        said.add_argument(flag, default=None, metavar="X", help=argparse.SUPPRESS)
    m = p.add_argument_group("mpirun's flags")
    m.add_argument(
        "--host",
        "-host",
        dest="hosts",
        default=argparse.SUPPRESS,
        metavar="HOST[:N],...",
        help="mpirun's spelling of -H (a host without :N has one slot)",
    )
    m.add_argument(
        "--bind-to",
        "-bind-to",
        default=None,
        metavar="WHAT",
        help="core (the default): each rank of a host runs on its own share of the host's "
        "cores; none: ranks are not bound (UNISON_BIND)",
    )
    m.add_argument(
        "--map-by",
        default=None,
        metavar="HOW",
        help="accepted: unison run fills each host's slots in order (mpirun's slot)",
    )
    m.add_argument(
        "--mca",
        "-mca",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="Open MPI parameter: btl_tcp_if_include/oob_tcp_if_include set the network "
        "interface; others are ignored",
    )
    m.add_argument(
        "--allow-run-as-root",
        action="store_true",
        help="accepted (unison run does not refuse root)",
    )


def habit_environment(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The variables the habit flags set for every rank, and one notice per flag accepted
    without effect; refuses (InvalidArgumentError) the ones unison cannot honour. Sets
    ``args.network_interface`` from ``--network-interfaces`` or ``--mca *_if_include``."""
    if args.mpi or args.jsrun:
        flag = "--mpi" if args.mpi else "--jsrun"
        raise InvalidArgumentError(f"{flag}: {_MPI_INSTEAD}")
    if args.check_build:
        raise InvalidArgumentError(
            "--check-build: run `unison info` to see what this installation can do"
        )
    env: dict[str, str] = {}
    notes: list[str] = []
    if args.timeline_filename:
        env["UNISON_TIMELINE"] = args.timeline_filename
    if args.timeline_mark_cycles:
        env["UNISON_TIMELINE_MARK_CYCLES"] = "1"
    if args.log_level:
        env["UNISON_LOG_LEVEL"] = args.log_level
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold_mb < 0:
            raise InvalidArgumentError(
                f"--fusion-threshold-mb must be >= 0, got {args.fusion_threshold_mb:g}"
            )
        env["UNISON_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * (1 << 20)))
    if args.cycle_time_ms is not None:
        env["UNISON_CYCLE_TIME"] = repr(float(args.cycle_time_ms))
    if args.cache_capacity is not None:
        env["UNISON_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.no_stall_check:
        env["UNISON_STALL_CHECK_DISABLE"] = "1"
    for flag, value, name in (
        ("--stall-check-warning-time-seconds", args.stall_check_warning_time_seconds,
         "UNISON_STALL_CHECK_TIME_SECONDS"),
        ("--stall-check-shutdown-time-seconds", args.stall_check_shutdown_time_seconds,
         "UNISON_STALL_SHUTDOWN_TIME_SECONDS"),
    ):  # fmt: skip
        if value is not None:
            if value < 0:
                raise InvalidArgumentError(f"{flag} must be >= 0 seconds, got {value:g}")
            env[name] = repr(float(value))
    interfaces = [i for i in (args.network_interfaces or "").split(",") if i.strip()]
    for key, value in args.mca:
        if key in _MCA_INTERFACE:
            interfaces += [i for i in value.split(",") if i.strip()]
        else:
            notes.append(f"--mca {key} ignored: unison's engine reads no Open MPI parameters")
    if interfaces and not args.network_interface:
        args.network_interface = interfaces[0].strip()
        if len(set(interfaces)) > 1:
            notes.append(f"unison uses one network interface: {args.network_interface}")
    if args.disable_cache:
        notes.append("--disable-cache ignored: unison run caches no checks between runs")
    if args.hierarchical_allreduce or args.hierarchical_allgather:
        notes.append(
            "--hierarchical-* ignored: unison picks the hierarchical all-reduce itself on "
            "jobs of several hosts (-x UNISON_ALGO=all_reduce:hierarchical forces it)"
        )
    autotune = [args.autotune_log_file, args.autotune_warmup_samples,
                args.autotune_steps_per_sample, args.autotune_bayes_opt_max_samples,
                args.autotune_gaussian_process_noise]  # fmt: skip
    if args.autotune or any(v is not None for v in autotune):
        notes.append(
            "--autotune ignored: unison chooses algorithms and sizes from its measured cost "
            "model (-x UNISON_ALGO=... forces an algorithm)"
        )
    if args.mpi_args is not None:
        notes.append("--mpi-args ignored: unison run starts no mpirun")
    if args.bind_to is not None:
        what = args.bind_to.split(":")[0].strip().lower()
        if what == "none":
            env["UNISON_BIND"] = "none"
        elif what in ("core", "hwthread", "cpu"):
            env["UNISON_BIND"] = "core"
        else:
            notes.append(
                f"--bind-to {args.bind_to} taken as core: each rank of a host is bound to its "
                "own share of the host's cores (--bind-to none: unbound)"
            )
    if args.map_by is not None and args.map_by.split(":")[0] not in ("slot", "core"):
        notes.append(
            f"--map-by {args.map_by} ignored: unison run fills each host's slots in order "
            "(mpirun's --map-by slot)"
        )
    return env, notes


def python_command(command: Sequence[str]) -> tuple[list[str], str | None]:
    """torchrun's habit: ``train.py ...`` (a Python file that is no command of its own)
    runs with this interpreter. Returns the command to run and a notice, or None."""
    command = list(command)
    if not command or not command[0].endswith(".py"):
        return command, None
    first = command[0]
    runnable = os.sep in first and os.access(first, os.X_OK)
    if runnable or (os.sep not in first and shutil.which(first)):
        return command, None  # an executable script (with its own #!) runs as it is
    if not os.path.isfile(first):
        return command, None  # "command not found", as before
    return [sys.executable, *command], f"running {first} with {sys.executable}"
