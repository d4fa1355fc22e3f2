"""Every ``UNISON_*`` environment variable, in one place.

Two kinds live here:

* **Job identity**, written by ``unison run`` (or translated from torchrun, mpirun
  and Slurm conventions by :mod:`unison.jobenv`): rank, size, store address,
  job secret. Their names are the ``ENV_*`` constants below.
* **Tuning knobs**, read once into the frozen :class:`Config` by :func:`load_config`.

``unison info --config`` prints the table :data:`KNOBS`. Horovod's variables of the same
meaning (:data:`HOROVOD_ALIASES`) are read where the ``UNISON_*`` one is unset. An unknown
``UNISON_*`` or ``HOROVOD_*`` variable, and a Horovod variable unison has no use for, is
reported (:func:`ignored_variables`: a typo or a habit should not silently do nothing).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError

__all__ = [
    "ENV_CPUS",
    "ENV_CROSS_RANK",
    "ENV_CROSS_SIZE",
    "ENV_ELASTIC_ID",
    "ENV_HOST_CORES",
    "ENV_HOST_ID",
    "ENV_JOB_ID",
    "ENV_LOCAL_RANK",
    "ENV_LOCAL_SIZE",
    "ENV_NUM_SERVERS",
    "ENV_PREFIX_OUTPUT",
    "ENV_PS_JOIN",
    "ENV_PS_JOIN_TICKET",
    "ENV_RANK",
    "ENV_ROLE",
    "ENV_RUN_FUNCTION",
    "ENV_SECRET",
    "ENV_SIZE",
    "ENV_STORE_ADDR",
    "ENV_STORE_PATH",
    "HOROVOD_ALIASES",
    "KNOBS",
    "Config",
    "Knob",
    "ignored_variables",
    "load_config",
    "unknown_variables",
]

# --- job identity, set by the launcher -------------------------------------------
ENV_RANK = "UNISON_RANK"
ENV_SIZE = "UNISON_SIZE"
ENV_LOCAL_RANK = "UNISON_LOCAL_RANK"
ENV_LOCAL_SIZE = "UNISON_LOCAL_SIZE"
ENV_CROSS_RANK = "UNISON_CROSS_RANK"
ENV_CROSS_SIZE = "UNISON_CROSS_SIZE"
ENV_STORE_ADDR = "UNISON_STORE_ADDR"  # host:port of the rendezvous store
ENV_SECRET = "UNISON_SECRET"  # hex job secret; authenticates store and peers
ENV_JOB_ID = "UNISON_JOB_ID"

# older collective spellings in UNISON_ALGO (unison.algorithms.select.ALIASES, kept equal)
_ALGO_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}
ENV_HOST_ID = "UNISON_HOST_ID"  # overrides the detected host identity
ENV_STORE_PATH = "UNISON_STORE_PATH"  # the store_path knob, read by job detection too
ENV_NUM_SERVERS = "UNISON_NUM_SERVERS"  # parameter-server processes: the last N ranks
ENV_ROLE = "UNISON_ROLE"  # "worker" or "server" (parameter server), overrides the above
ENV_ELASTIC_ID = "UNISON_ELASTIC_ID"  # elastic jobs: this worker's id (see unison.elastic)
ENV_PS_JOIN = "UNISON_PS_JOIN"  # elastic parameter server: join the running job as this worker
ENV_PS_JOIN_TICKET = "UNISON_PS_JOIN_TICKET"  # ... through this join, claimed by the launcher
ENV_OUTPUT_TTY = "UNISON_OUTPUT_TTY"  # "1": the launcher's output is a terminal
ENV_PREFIX_OUTPUT = "UNISON_PREFIX_OUTPUT"  # also the knob; unison run sets it for ranks
ENV_RUN_FUNCTION = "UNISON_RUN_FUNCTION"  # unison.run: host:port:secret of its store
ENV_CPUS = "UNISON_CPUS"  # unison run: the CPUs it bound this rank to (its share)
ENV_HOST_CORES = "UNISON_HOST_CORES"  # ... and how many this host's ranks share

_IDENTITY = {
    ENV_RANK: "global rank of this process",
    ENV_SIZE: "number of processes in the job",
    ENV_LOCAL_RANK: "rank among the processes on this host",
    ENV_LOCAL_SIZE: "number of processes on this host",
    ENV_CROSS_RANK: "index of this host (Horovod's cross_rank)",
    ENV_CROSS_SIZE: "number of hosts (Horovod's cross_size)",
    ENV_STORE_ADDR: "host:port of the rendezvous store",
    ENV_SECRET: "hex job secret for the store and peer handshakes",
    ENV_JOB_ID: "job identifier, part of every handshake",
    ENV_HOST_ID: "host identity override (ranks with equal ids share a host)",
    ENV_NUM_SERVERS: "parameter-server processes: the last N ranks (unison run --servers N)",
    ENV_ROLE: "this process's parameter-server role, worker or server (overrides the above)",
    ENV_ELASTIC_ID: "set by unison run in an elastic job: this worker's id; init() then takes "
    "its rank and size from the driver's latest round (unison.elastic)",
    ENV_PS_JOIN: "set by unison run --servers in an elastic job: this worker joins the "
    "running parameter-server job with this worker id (unison.ps.join)",
    ENV_PS_JOIN_TICKET: "set by unison run with UNISON_PS_JOIN: the join the launcher claimed "
    "for this worker (so it can cancel the servers' wait if the worker dies first)",
    ENV_OUTPUT_TTY: "set by unison run: 1 when its output is a terminal (progress bars make "
    "sense), else 0",
    ENV_RUN_FUNCTION: "set by unison.run for its ranks: where they fetch the function to "
    "call and leave its result",
    ENV_CPUS: "set by unison run where it binds each rank to its share of the host's cores "
    "(UNISON_BIND): the CPUs this rank runs on",
    ENV_HOST_CORES: "set by unison run with UNISON_CPUS: how many cores this host's ranks "
    "share (whether they outnumber them, though each rank sees only its own)",
}


@dataclass(frozen=True)
class Knob:
    """One tuning variable: its name, the Config field it fills, default and meaning."""

    env: str
    field: str
    default: Any
    parse: Callable[[str], Any]
    doc: str


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


def _size(text: str) -> int:
    """Parse '4096', '64K', '1M', '2G' (binary units)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    value = int(float(t) * mult)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _log_level(text: str) -> str:
    """A logging level name; Horovod's TRACE and FATAL mean DEBUG and CRITICAL."""
    low = text.strip().upper()
    low = {"TRACE": "DEBUG", "FATAL": "CRITICAL", "WARN": "WARNING"}.get(low, low)
    if low not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("expected one of debug, info, warning, error, critical")
    return low


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _group_slots(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 4096:
        raise ValueError("must be between 1 and 4096")
    return value


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return low

    return parse


KNOBS: tuple[Knob, ...] = (
    Knob(
        "UNISON_TIMEOUT",
        "timeout",
        300.0,
        _positive_float,
        "default deadline in seconds of every blocking call",
    ),
    Knob(
        "UNISON_ALGO",
        "algo",
        "",
        str,
        "force algorithms, e.g. 'all_reduce:ring,broadcast:binomial'",
    ),
    Knob(
        "UNISON_TRANSPORT",
        "transport",
        "auto",
        _choice("auto", "tcp", "shm"),
        "transport between ranks: auto (shm on one host, else tcp) or forced",
    ),
    Knob(
        "UNISON_SEGMENT_BYTES",
        "segment_bytes",
        1 << 20,
        _size,
        "pipeline segment of large collectives (bytes, K/M/G suffixes)",
    ),
    Knob(
        "UNISON_INLINE_SEND_BYTES",
        "inline_send_bytes",
        1 << 16,
        _size,
        "messages up to this size are sent from the caller's thread",
    ),
    Knob(
        "UNISON_SMALL_BYTES",
        "small_bytes",
        1 << 20,
        _size,
        "collectives up to this size (sub-groups: up to 64 KiB at most) on one host take "
        "the shared slot path (not while UNISON_ALGO forces algorithms); every rank "
        "allocates twice this in /dev/shm for the world's slots; 0: off",
    ),
    Knob(
        "UNISON_GROUP_SLOTS",
        "group_slots",
        8,
        _group_slots,
        "groups with a shared slot region on one host: the world and the first N-1 "
        "sub-groups (later ones take the general path); every rank must agree, else none "
        "get slots",
    ),
    Knob(
        "UNISON_GROUP_ARENA_BYTES",
        "group_arena_bytes",
        8 << 20,
        _size,
        "per rank and per sub-group with a slot region (UNISON_GROUP_SLOTS): bytes of shared "
        "memory the sub-group's direct shared-memory algorithms copy through (one host), "
        "allocated in /dev/shm when the group is made (a group whose members cannot all "
        "allocate theirs takes the message-based algorithms); 0: sub-groups take those",
    ),
    Knob(
        "UNISON_WAIT_ADAPT",
        "wait_adapt",
        False,
        _bool,
        "where a host's ranks outnumber its cores, a small collective's wait chooses between "
        "one sched_yield before sleeping on the futex and yield-polling, by the time per call "
        "each gave lately (off by default: under load it did not beat one yield then the "
        "futex)",
    ),
    Knob(
        "UNISON_LOG_LEVEL",
        "log_level",
        "WARNING",
        _log_level,
        "logging level of the 'unison' loggers (HOROVOD_LOG_LEVEL)",
    ),
    Knob(
        "UNISON_BIND_ADDR",
        "bind_addr",
        "",
        str,
        "address the peer listener binds (default: all interfaces)",
    ),
    Knob(
        "UNISON_NETWORK_INTERFACE",
        "network_interface",
        "",
        str,
        "interface whose address peers are told to connect to",
    ),
    Knob(
        "UNISON_BIND",
        "bind",
        "auto",
        _choice("auto", "core", "none"),
        "unison run: bind each rank of a host to its own share of the host's cores (as "
        "mpirun binds to cores), so the scheduler cannot stack ranks on one core while "
        "others idle; auto: where unison run also sets the thread counts (the user set "
        "none), core: also where the user did, none: never (--bind-to none)",
    ),
    Knob(
        "UNISON_BACKEND",
        "backend",
        "native",
        _choice("native", "mpi", "torch"),
        "engine that moves the bytes",
    ),
    Knob(
        "UNISON_CHECK_MISMATCH",
        "check_mismatch",
        True,
        _bool,
        "compare each collective's signature across ranks (desync detection)",
    ),
    Knob(
        "UNISON_PREFIX_OUTPUT",
        "prefix_output",
        True,
        _bool,
        "unison run: prefix each output line with its rank",
    ),
    Knob(
        "UNISON_STORE_PATH",
        "store_path",
        "",
        str,
        "directory of a file store, for launchers that provide no store address",
    ),
    Knob(
        "UNISON_FAULTS",
        "faults",
        "",
        str,
        "tests only: inject faults, e.g. 'kill@rank=1,op=5' (unison.testing.faults)",
    ),
    Knob(
        "UNISON_FUSION_THRESHOLD",
        "fusion_threshold",
        128 << 20,
        _size,
        "unison.torch: fuse ready all-reduces into one buffer up to this size "
        "(HOROVOD_FUSION_THRESHOLD)",
    ),
    Knob(
        "UNISON_CYCLE_TIME",
        "cycle_time",
        0.0,
        float,
        "unison.torch: ms to wait for more tensors before negotiating; 0 = start at once "
        "(HOROVOD_CYCLE_TIME)",
    ),
    Knob(
        "UNISON_GRADIENT_OVERLAP",
        "gradient_overlap",
        "auto",
        _choice("auto", "on", "off"),
        "unison.torch DistributedOptimizer: reduce gradients while the backward pass runs "
        "(on) or all at step() (off); auto: off where the parameters are on the CPU and "
        "this host has no more cores than ranks",
    ),
    Knob(
        "UNISON_CACHE_CAPACITY",
        "cache_capacity",
        1024,
        int,
        "unison.torch: response cache entries; 0 disables (HOROVOD_CACHE_CAPACITY)",
    ),
    Knob(
        "UNISON_TIMELINE",
        "timeline",
        "",
        str,
        "unison.torch: write a Chrome-trace timeline to this file on rank 0 (HOROVOD_TIMELINE)",
    ),
    Knob(
        "UNISON_TIMELINE_MARK_CYCLES",
        "timeline_mark_cycles",
        False,
        _bool,
        "unison.torch: mark negotiation cycles in the timeline (HOROVOD_TIMELINE_MARK_CYCLES)",
    ),
    Knob(
        "UNISON_STALL_CHECK_DISABLE",
        "stall_check_disable",
        False,
        _bool,
        "unison.torch: disable the stall inspector (HOROVOD_STALL_CHECK_DISABLE)",
    ),
    Knob(
        "UNISON_STALL_CHECK_TIME_SECONDS",
        "stall_check_time",
        60.0,
        _positive_float,
        "unison.torch: warn about tensors missing on some ranks after this many seconds "
        "(HOROVOD_STALL_CHECK_TIME_SECONDS)",
    ),
    Knob(
        "UNISON_STALL_SHUTDOWN_TIME_SECONDS",
        "stall_shutdown_time",
        0.0,
        float,
        "unison.torch: fail stalled tensors on every rank after this many seconds; 0 = never "
        "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
    ),
    # link model (unison.transport.calibrate): measured per host; these pin a value
    Knob("UNISON_SHM_ALPHA", "shm_alpha", 0.0, _positive_float, "shm seconds per message"),
    Knob("UNISON_SHM_BETA", "shm_beta", 0.0, _positive_float, "shm seconds per byte"),
    Knob("UNISON_TCP_ALPHA", "tcp_alpha", 0.0, _positive_float, "tcp seconds per message"),
    Knob("UNISON_TCP_BETA", "tcp_beta", 0.0, _positive_float, "tcp seconds per byte"),
    Knob("UNISON_CALL_OVERHEAD", "call_overhead", 0.0, _positive_float, "seconds per call"),
    Knob("UNISON_SHM_SYNC", "shm_sync", 0.0, _positive_float, "seconds per slot round sync"),
    Knob(
        "UNISON_SHM_SYNC_CROWDED",
        "shm_sync_crowded",
        0.0,
        _positive_float,
        "seconds per slot round sync, 2 ranks per core",
    ),
    Knob("UNISON_LINK_CACHE", "link_cache", "", str, "link-model cache dir; off: none"),
    Knob(
        "UNISON_PS_ELASTIC",
        "ps_elastic",
        False,
        _bool,
        "unison.ps: a lost worker leaves the job (its clock stops holding back SSP/BSP) "
        "instead of failing every other worker, and workers may join it (UNISON_PS_JOIN); "
        "set by unison run --servers in an elastic job",
    ),
    Knob(
        "UNISON_ELASTIC_TIMEOUT",
        "elastic_timeout",
        600.0,
        _positive_float,
        "elastic jobs: how long a worker waits for the next world after a reset, and the "
        "launcher for --min-np slots (unison run --elastic-timeout; HOROVOD_ELASTIC_TIMEOUT)",
    ),
)


@dataclass(frozen=True)
class Config:
    """Tuning knobs, parsed once from the environment. See :data:`KNOBS`."""

    timeout: float = 300.0
    algo: str = ""
    transport: str = "auto"
    segment_bytes: int = 1 << 20
    inline_send_bytes: int = 1 << 16
    small_bytes: int = 1 << 20
    group_slots: int = 8
    group_arena_bytes: int = 8 << 20
    wait_adapt: bool = False
    log_level: str = "WARNING"
    bind_addr: str = ""
    network_interface: str = ""
    bind: str = "auto"
    backend: str = "native"
    check_mismatch: bool = True
    prefix_output: bool = True
    store_path: str = ""
    faults: str = ""
    fusion_threshold: int = 128 << 20
    cycle_time: float = 0.0
    cache_capacity: int = 1024
    gradient_overlap: str = "auto"
    timeline: str = ""
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time: float = 60.0
    stall_shutdown_time: float = 0.0
    shm_alpha: float = 0.0
    shm_beta: float = 0.0
    tcp_alpha: float = 0.0
    tcp_beta: float = 0.0
    call_overhead: float = 0.0
    shm_sync: float = 0.0
    shm_sync_crowded: float = 0.0
    link_cache: str = ""
    elastic_timeout: float = 600.0
    ps_elastic: bool = False
    #: the elastic rendezvous round this process joins (set by init() in an elastic job)
    elastic_round: int = -1

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def algo_overrides(self) -> dict[str, str]:
        """``UNISON_ALGO`` as {collective: algorithm}, collectives spelled as the public
        API spells them (the older ``allreduce``, ``allgather``, ``alltoall`` map there)."""
        out: dict[str, str] = {}
        for item in self.algo.split(","):
            item = item.strip()
            if not item:
                continue
            coll, sep, name = item.partition(":")
            if not sep or not coll.strip() or not name.strip():
                raise InvalidArgumentError(
                    f"UNISON_ALGO entry {item!r} is not of the form collective:algorithm"
                )
            key = coll.strip().lower()
            out[_ALGO_ALIASES.get(key, key)] = name.strip().lower()
        return out


#: Horovod's variables that set a knob of :data:`KNOBS` (read when the knob is unset)
HOROVOD_ALIASES: dict[str, str] = {
    "HOROVOD_LOG_LEVEL": "UNISON_LOG_LEVEL",
    "HOROVOD_FUSION_THRESHOLD": "UNISON_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME": "UNISON_CYCLE_TIME",
    "HOROVOD_CACHE_CAPACITY": "UNISON_CACHE_CAPACITY",
    "HOROVOD_TIMELINE": "UNISON_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES": "UNISON_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_DISABLE": "UNISON_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "UNISON_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "UNISON_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_ELASTIC_TIMEOUT": "UNISON_ELASTIC_TIMEOUT",
}
_ALIAS_OF = {unison: horovod for horovod, unison in HOROVOD_ALIASES.items()}

#: Horovod's variables set by its launchers (and ``unison run``): a rank's identity
_HOROVOD_IDENTITY = frozenset(
    "HOROVOD_RANK HOROVOD_SIZE HOROVOD_LOCAL_RANK HOROVOD_LOCAL_SIZE HOROVOD_CROSS_RANK "
    "HOROVOD_CROSS_SIZE HOROVOD_HOSTNAME HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS "
    "HOROVOD_GLOO_RENDEZVOUS_ADDR HOROVOD_GLOO_RENDEZVOUS_PORT HOROVOD_GLOO_IFACE "
    "HOROVOD_GLOO_TIMEOUT_SECONDS HOROVOD_ELASTIC HOROVOD_IFACE".split()
)
#: Horovod's build-time variables (``HOROVOD_WITH_PYTORCH=1 pip install horovod``):
#: they stay in many shells and mean nothing at run time, to Horovod as to unison
_HOROVOD_BUILD = ("HOROVOD_WITH", "HOROVOD_WITHOUT", "HOROVOD_GPU", "HOROVOD_NCCL",
                  "HOROVOD_CUDA", "HOROVOD_ROCM", "HOROVOD_BUILD", "HOROVOD_CMAKE",
                  "HOROVOD_MPICXX", "HOROVOD_DEBUG")  # fmt: skip
_AUTOTUNE = (
    "unison chooses each collective's algorithm from its measured cost model "
    "(UNISON_ALGO=all_reduce:ring forces one; see `unison info --config`)"
)
#: Horovod's run-time variables unison has no counterpart of, and what to do instead
_HOROVOD_IGNORED: dict[str, str] = {
    "HOROVOD_AUTOTUNE": _AUTOTUNE,
    "HOROVOD_AUTOTUNE_LOG": _AUTOTUNE,
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": _AUTOTUNE,
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": _AUTOTUNE,
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": _AUTOTUNE,
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": _AUTOTUNE,
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "unison takes the hierarchical all-reduce by "
    "itself on jobs of several hosts (UNISON_ALGO=all_reduce:hierarchical forces it)",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "unison has no hierarchical all-gather; its "
    "all-gather takes shared memory on each host by itself",
    "HOROVOD_START_TIMEOUT": "a rank has no use for it: give it to the launcher (unison run "
    "--start-timeout S)",
    "HOROVOD_MPI_THREADS_DISABLE": "unison's MPI engine asks for the thread level it needs",
    "HOROVOD_THREAD_AFFINITY": "unison pins no threads (unison run divides the "
    "cores among ranks as OMP_NUM_THREADS)",
    "HOROVOD_NUM_NCCL_STREAMS": "unison runs on CPUs",
    "HOROVOD_LOG_TIMESTAMP": "unison's log lines carry no timestamp",
    "HOROVOD_LOG_HIDE_TIME": "unison's log lines carry no timestamp",
}


def _knob_text(env: Mapping[str, str], knob: Knob) -> tuple[str, str] | None:
    """(variable, text) that sets ``knob``: its own, else Horovod's alias; None if unset."""
    for name in (knob.env, _ALIAS_OF.get(knob.env)):
        raw = env.get(name) if name else None
        if name and raw is not None and raw != "":
            return name, raw
    return None


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Read every knob of :data:`KNOBS` from ``env`` (default ``os.environ``), or its
    Horovod alias (:data:`HOROVOD_ALIASES`) where the knob is unset."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for knob in KNOBS:
        found = _knob_text(env, knob)
        if found is None:
            continue
        name, raw = found
        try:
            values[knob.field] = knob.parse(raw)
        except ValueError as exc:
            raise InvalidArgumentError(f"{name}={raw!r}: {exc}") from None
    cfg = Config(**values)
    cfg.algo_overrides()  # validate early
    return cfg


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """``UNISON_*`` variables that are neither a knob nor job identity (likely typos);
    ``UNISON_TEST_*`` is left to test suites."""
    env = os.environ if env is None else env
    known = {k.env for k in KNOBS} | set(_IDENTITY)
    return sorted(
        k
        for k in env
        if k.startswith("UNISON_") and k not in known and not k.startswith("UNISON_TEST_")
    )


def identity_docs() -> dict[str, str]:
    """The job-identity variables and their meaning."""
    return dict(_IDENTITY)


def ignored_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(name, why)`` for each ``UNISON_*`` or ``HOROVOD_*`` variable in ``env`` that
    changes nothing: a name no knob has (with the closest known name, a likely typo), or
    a Horovod setting unison has no counterpart of (with what to do instead). Horovod's
    aliases, identity and build-time variables are not listed."""
    import difflib

    env = os.environ if env is None else env
    out: list[tuple[str, str]] = []
    ours = sorted({k.env for k in KNOBS} | set(_IDENTITY))
    for name in unknown_variables(env):
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else " (see `unison info --config`)"
        out.append((name, f"unknown variable {name} is ignored{hint}"))
    horovod = sorted(set(HOROVOD_ALIASES) | _HOROVOD_IDENTITY | set(_HOROVOD_IGNORED))
    for name in sorted(k for k in env if k.startswith("HOROVOD_")):
        if name in HOROVOD_ALIASES or name in _HOROVOD_IDENTITY or name.startswith(_HOROVOD_BUILD):
            continue
        if name in _HOROVOD_IGNORED:
            out.append((name, f"{name} is ignored: {_HOROVOD_IGNORED[name]}"))
            continue
        close = difflib.get_close_matches(name, horovod, n=1, cutoff=0.8)
        if close:
            alias = HOROVOD_ALIASES.get(close[0])
            meant = f"{close[0]} ({alias})" if alias else close[0]
            hint = f"; did you mean {meant}?"
        else:
            hint = (
                " (unison reads no such variable; `unison info --config` lists the ones it reads)"
            )
        out.append((name, f"unknown variable {name} is ignored{hint}"))
    return out
