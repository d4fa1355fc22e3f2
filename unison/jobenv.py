"""Who am I in which job? Environment conventions of every launcher, in one place.

:func:`detect_job` reads, in this order (the first that applies wins):

1. explicit arguments (``rank``, ``size``, ``store_addr``, ``secret``);
2. ``UNISON_*`` (written by ``unison run``);
3. torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` ...);
4. Open MPI (``OMPI_COMM_WORLD_*``);
5. PMI / MPICH Hydra / Intel MPI (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` ...);
6. Slurm ``srun`` (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_STEP_NODELIST`` ...);
7. nothing: a single process (rank 0 of 1).

``UNISON_STORE_ADDR`` and ``UNISON_SECRET`` also apply under the other conventions.
Where a launcher gives no store address (mpirun), the job uses a
:class:`~unison.store.FileStore` at ``store_path``. Where it gives no secret
(torchrun, Slurm, mpirun), one is derived from the job's identity, with a warning where
the store listens on the network (the store is then only as private as that identity;
the warning names the fix) and an INFO line where it listens on loopback only.

:data:`FAILURE_KEY` is the store key under which a failing rank records why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from . import config as C
from .errors import InvalidArgumentError
from .jobdir import derived_store_path
from .log import get_logger

__all__ = [
    "host_cores",
    "usable_cores",
    "usable_cpus",
    "from_openmpi",
    "from_pmi",
    "from_slurm",
    "FAILURE_KEY",
    "JobInfo",
    "detect_job",
    "launcher_layout",
    "expand_nodelist",
    "failure_record",
    "parse_failure_record",
    "parse_store_addr",
    "secret_from_env",
    "slurm_store_port",
]

_log = get_logger("launch")

#: store key (unprefixed, on the job's root store) where rank ``r`` records its failure
FAILURE_KEY = "unison/failure/{rank}"


SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000


@dataclass(frozen=True)
class JobInfo:
    """This process's place in the job and how to reach the job's store."""

    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    cross_rank: int | None
    cross_size: int | None
    store_addr: tuple[str, int] | None
    store_path: str | None
    secret: bytes | None
    job_id: str
    host_store: bool  # this process must start the TCPStoreServer at store_addr
    source: str  # "unison", "explicit", "torchrun", "openmpi", "pmi", "slurm", "single"


def failure_record(summary: str, when: float | None = None) -> bytes:
    """The value a failing rank stores under :data:`FAILURE_KEY` (one-line summary + time)."""
    first = summary.strip().splitlines()[-1] if summary.strip() else "unknown error"
    return json.dumps({"error": first, "time": time.time() if when is None else when}).encode()


def parse_failure_record(raw: bytes) -> tuple[str, float | None]:
    """(summary, wall-clock time or None); accepts :func:`failure_record` or plain text."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), str):
        when = obj.get("time")
        return obj["error"], float(when) if isinstance(when, (int, float)) else None
    return (text.splitlines()[-1] if text else "unknown error"), None


# -- parsing helpers ------------------------------------------------------------------
def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidArgumentError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise InvalidArgumentError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _need(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    value = _int(env, name, minimum=minimum)
    if value is None:
        raise InvalidArgumentError(f"{name} is not set")
    return value


def _check_rank(rank: int, size: int, rank_name: str, size_name: str) -> None:
    if size < 1:
        raise InvalidArgumentError(f"{size_name}={size} must be >= 1")
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"{rank_name}={rank} is not in [0, {size_name}={size})")


def parse_store_addr(text: str, name: str = C.ENV_STORE_ADDR) -> tuple[str, int]:
    """``host:port`` or ``[v6addr]:port`` as (host, port)."""
    m = re.fullmatch(r"\s*(?:\[([^\]]+)\]|([^:\s]+)):(\d+)\s*", text)
    if not m:
        raise InvalidArgumentError(f"{name}={text!r} is not host:port")
    port = int(m.group(3))
    if not 0 < port < 65536:
        raise InvalidArgumentError(f"{name}={text!r}: port out of range")
    return (m.group(1) or m.group(2)), port


def secret_from_env(env: Mapping[str, str]) -> bytes | None:
    """The job secret ``UNISON_SECRET`` holds (hex), or None where it is unset."""
    raw = env.get(C.ENV_SECRET, "").strip()
    if not raw:
        return None
    try:
        value = bytes.fromhex(raw)
    except ValueError:
        raise InvalidArgumentError(f"{C.ENV_SECRET} is not a hex string") from None
    if not value:
        raise InvalidArgumentError(f"{C.ENV_SECRET} is empty")
    return value


#: how to give every rank one secret, per launcher convention (the fix the warning names)
_SECRET_FIX = {
    "torchrun": "export UNISON_SECRET=<the same hex on every host> before torchrun "
    "(e.g. UNISON_SECRET=$(openssl rand -hex 16), copied to each host)",
    "openmpi": "mpirun -x UNISON_SECRET=$(openssl rand -hex 16) ...",
    "pmi": "export UNISON_SECRET=$(openssl rand -hex 16) before mpiexec and forward it "
    "(mpiexec -genvall or -env UNISON_SECRET ...)",
    "slurm": "export UNISON_SECRET=$(openssl rand -hex 16) before srun (srun passes it on)",
}


def _derived_secret(
    identity: str, warn: bool = True, exposed: bool = False, source: str = ""
) -> bytes:
    """The job's secret when none was given: derived from its identity. Rank 0 says so,
    once per job: at INFO when the store listens on loopback only, else at WARNING with
    the exact way to give every rank a secret under this launcher."""
    if warn and exposed:
        fix = _SECRET_FIX.get(source, "export UNISON_SECRET=<the same hex> to every rank")
        _log.warning(
            "no %s set: the store and the peers' sockets listen on the network, guarded by a "
            "secret derived from the job identity (%s); give every rank a real one: %s",
            C.ENV_SECRET,
            identity,
            fix,
        )
    elif warn:
        _log.info(
            "no %s set: deriving the store secret from the job identity (%s); the store "
            "listens on loopback only",
            C.ENV_SECRET,
            identity,
        )
    return hashlib.sha256(b"unison-derived-secret\0" + identity.encode()).digest()


_warned_unknown: set[str] = set()


def warn_unknown_variables(env: Mapping[str, str]) -> None:
    """Warn (once per process; init calls it on rank 0 only) about each ``UNISON_*`` or
    ``HOROVOD_*`` variable that changes nothing (:func:`unison.config.ignored_variables`):
    a typo or a Horovod habit would otherwise silently do nothing."""
    for name, why in C.ignored_variables(env):
        if name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        _log.warning("%s", why)


# -- Slurm nodelists ------------------------------------------------------------------
def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidArgumentError(f"unbalanced brackets in nodelist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise InvalidArgumentError(f"unbalanced brackets in nodelist {text!r}")
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_one(pattern: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", pattern)
    if not m:
        return [pattern]
    head, ranges, tail = m.groups()
    tails = _expand_one(tail)
    out: list[str] = []
    for item in ranges.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InvalidArgumentError(f"bad range {item!r} in nodelist {pattern!r}")
        start, stop = int(lo), int(hi) if sep else int(lo)
        if stop < start:
            raise InvalidArgumentError(f"descending range {item!r} in nodelist {pattern!r}")
        out.extend(f"{head}{n:0{len(lo)}d}{t}" for n in range(start, stop + 1) for t in tails)
    return out


def expand_nodelist(text: str) -> list[str]:
    """Expand Slurm's compact host list: ``node[01-03,7],gpu5`` -> node01..node03 node7 gpu5."""
    return [host for part in _split_top(text) for host in _expand_one(part)]


def _tasks_on_node(spec: str, node: int) -> int | None:
    """Tasks on node ``node`` from SLURM_TASKS_PER_NODE like ``2(x3),1``."""
    index = 0
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        count, reps = int(m.group(1)), int(m.group(2) or 1)
        if node < index + reps:
            return count
        index += reps
    return None


def slurm_store_port(job_id: int, step_id: int) -> int:
    """The store port every rank of a Slurm step derives from the job and step ids."""
    return SLURM_PORT_BASE + (job_id * 7919 + step_id * 104729) % SLURM_PORT_SPAN


# -- conventions ----------------------------------------------------------------------
def _from_unison(env: Mapping[str, str]) -> JobInfo | None:
    rank, size = _int(env, C.ENV_RANK), _int(env, C.ENV_SIZE, minimum=1)
    if rank is None and size is None:
        return None
    if rank is None or size is None:
        missing = C.ENV_RANK if rank is None else C.ENV_SIZE
        raise InvalidArgumentError(
            f"{missing} is not set (both {C.ENV_RANK} and {C.ENV_SIZE} are needed)"
        )
    _check_rank(rank, size, C.ENV_RANK, C.ENV_SIZE)
    return JobInfo(
        rank=rank,
        size=size,
        local_rank=_int(env, C.ENV_LOCAL_RANK),
        local_size=_int(env, C.ENV_LOCAL_SIZE, minimum=1),
        cross_rank=_int(env, C.ENV_CROSS_RANK),
        cross_size=_int(env, C.ENV_CROSS_SIZE, minimum=1),
        store_addr=None,
        store_path=None,
        secret=None,
        job_id=env.get(C.ENV_JOB_ID, "").strip() or "unison",
        host_store=False,
        source="unison",
    )


def _from_torchrun(env: Mapping[str, str]) -> JobInfo | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank, size = _need(env, "RANK"), _need(env, "WORLD_SIZE", minimum=1)
    _check_rank(rank, size, "RANK", "WORLD_SIZE")
    local_size = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    cross_size = _int(env, "GROUP_WORLD_SIZE", minimum=1)
    if cross_size is None and local_size and size % local_size == 0:
        cross_size = size // local_size
    master = env.get("MASTER_ADDR", "").strip() or "127.0.0.1"
    port = _int(env, "MASTER_PORT", minimum=1)
    addr: tuple[str, int] | None = None
    if port is not None:
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true"
        port = port + 1 if agent else port
        if port > 65535:
            raise InvalidArgumentError(f"MASTER_PORT={env['MASTER_PORT']!r} is out of range")
        addr = (master, port)
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    job_id = f"torchrun-{run_id}" if run_id else f"torchrun-{master}-{port}"
    return JobInfo(
        rank=rank,
        size=size,
        local_rank=_int(env, "LOCAL_RANK"),
        local_size=local_size,
        cross_rank=_int(env, "GROUP_RANK"),
        cross_size=cross_size,
        store_addr=addr,
        store_path=None,
        secret=None,
        job_id=job_id,
        host_store=rank == 0 and addr is not None,
        source="torchrun",
    )


def _mpi_job(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return re.sub(r"[^A-Za-z0-9_.-]", "_", value)
    return None


def from_openmpi(env: Mapping[str, str]) -> JobInfo | None:
    if "OMPI_COMM_WORLD_RANK" not in env:
        return None
    rank = _need(env, "OMPI_COMM_WORLD_RANK")
    size = _need(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
    _check_rank(rank, size, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    job = _mpi_job(env, "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid")
    return JobInfo(
        rank=rank,
        size=size,
        local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1),
        cross_rank=None,
        cross_size=None,
        store_addr=None,
        store_path=None,
        secret=None,
        job_id=f"ompi-{job}" if job else "",
        host_store=False,
        source="openmpi",
    )


def from_pmi(env: Mapping[str, str]) -> JobInfo | None:
    if "PMI_RANK" not in env:
        return None
    rank, size = _need(env, "PMI_RANK"), _need(env, "PMI_SIZE", minimum=1)
    _check_rank(rank, size, "PMI_RANK", "PMI_SIZE")
    job = _mpi_job(env, "PMI_JOBID", "PMIX_NAMESPACE", "PMI_KVSNAME", "SLURM_JOB_ID")
    return JobInfo(
        rank=rank,
        size=size,
        local_rank=_int(env, "MPI_LOCALRANKID"),
        local_size=_int(env, "MPI_LOCALNRANKS", minimum=1),
        cross_rank=None,
        cross_size=None,
        store_addr=None,
        store_path=None,
        secret=None,
        job_id=f"pmi-{job}" if job else "",
        host_store=False,
        source="pmi",
    )


def _slurm_store(env: Mapping[str, str]) -> tuple[tuple[str, int], str]:
    job = _need(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else _need(env, "SLURM_JOBID")
    step = _int(env, "SLURM_STEP_ID") or 0
    nodes = ""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        nodes = env.get(name, "").strip()
        if nodes:
            break
    hosts = expand_nodelist(nodes) if nodes else []
    if not hosts:
        raise InvalidArgumentError("SLURM_STEP_NODELIST / SLURM_NODELIST is not set")
    return (hosts[0], slurm_store_port(job, step)), f"slurm-{job}.{step}"


def from_slurm(env: Mapping[str, str]) -> JobInfo | None:
    if "SLURM_PROCID" not in env:
        return None
    rank = _need(env, "SLURM_PROCID")
    size_name = "SLURM_NTASKS" if "SLURM_NTASKS" in env else "SLURM_NPROCS"
    size = _need(env, size_name, minimum=1)
    _check_rank(rank, size, "SLURM_PROCID", size_name)
    node = _int(env, "SLURM_NODEID")
    local_size = _int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
    if local_size is None and node is not None and env.get("SLURM_TASKS_PER_NODE"):
        local_size = _tasks_on_node(env["SLURM_TASKS_PER_NODE"], node)
    cross_size = None
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        cross_size = _int(env, name, minimum=1)
        if cross_size is not None:
            break
    addr, job_id = _slurm_store(env)
    return JobInfo(
        rank=rank,
        size=size,
        local_rank=_int(env, "SLURM_LOCALID"),
        local_size=local_size,
        cross_rank=node,
        cross_size=cross_size,
        store_addr=addr,
        store_path=None,
        secret=None,
        job_id=job_id,
        host_store=rank == 0,
        source="slurm",
    )


#: the launchers' conventions, in the order a process's job is looked for
_CONVENTIONS = (_from_unison, _from_torchrun, from_openmpi, from_pmi, from_slurm)


def launcher_layout(env: Mapping[str, str], rank: int, size: int) -> tuple[int | None, int | None]:
    """(local_rank, local_size) as this process's launcher announced them (``unison
    run``, torchrun, Open MPI, MPICH, Slurm), for a process that learnt its rank and size
    elsewhere (torch.distributed's backend constructor): (None, None) where no launcher
    announced this very rank and size, or its variables do not parse."""
    for convention in _CONVENTIONS:
        try:
            info = convention(env)
        except InvalidArgumentError:
            continue
        if info is not None:
            if (info.rank, info.size) == (rank, size):
                return info.local_rank, info.local_size
            break
    return None, None


def detect_job(
    env: Mapping[str, str] | None = None,
    *,
    rank: int | None = None,
    size: int | None = None,
    store_addr: tuple[str, int] | str | None = None,
    secret: bytes | None = None,
) -> JobInfo:
    """This process's :class:`JobInfo`, from explicit arguments or ``env`` (os.environ)."""
    env = os.environ if env is None else env
    info: JobInfo | None = None
    for convention in _CONVENTIONS:
        info = convention(env)
        if info is not None:
            break
    if info is None:
        info = JobInfo(0, 1, 0, 1, 0, 1, None, None, None, "single", False, "single")

    if rank is not None or size is not None:
        if rank is None or size is None:
            raise InvalidArgumentError("pass both rank= and size= (or neither)")
        _check_rank(rank, size, "rank", "size")
        same = (rank, size) == (info.rank, info.size)
        info = dataclasses.replace(
            info,
            rank=rank,
            size=size,
            source="explicit",
            host_store=info.host_store and same,
            job_id="" if info.source == "single" else info.job_id,
        )
        if not same:
            info = dataclasses.replace(
                info, local_rank=None, local_size=None, cross_rank=None, cross_size=None
            )

    # store address: explicit > UNISON_STORE_ADDR > the convention's own
    addr = info.store_addr
    host_store = info.host_store
    if env.get(C.ENV_STORE_ADDR, "").strip():
        addr, host_store = parse_store_addr(env[C.ENV_STORE_ADDR]), False
    if store_addr is not None:
        addr = (
            parse_store_addr(store_addr, "store_addr")
            if isinstance(store_addr, str)
            else (str(store_addr[0]), int(store_addr[1]))
        )
        host_store = info.source == "explicit" and info.rank == 0
    if (
        addr is None
        and info.source in ("openmpi", "pmi")
        and "SLURM_PROCID" in env
        and env.get("SLURM_PROCID", "").strip() == str(info.rank)
    ):
        addr, slurm_id = _slurm_store(env)  # srun launched us: rank 0 hosts a TCP store
        host_store = info.rank == 0
        info = dataclasses.replace(info, job_id=info.job_id or slurm_id)

    # store path, for conventions with no address at all
    path = None
    if addr is None and info.size > 1:
        path = env.get(C.ENV_STORE_PATH, "").strip() or None
        if path is None:
            path = derived_store_path(
                env, info.source, info.job_id, info.rank, info.size, info.local_size
            )
    job_id = info.job_id or f"{info.source}-job"

    # secret: explicit > UNISON_SECRET > derived from the job identity
    key = secret if secret is not None else secret_from_env(env)
    if key is None and info.size > 1:
        where = f"{addr[0]}:{addr[1]}" if addr else path
        exposed = addr is not None and not addr[0].startswith("127.") and addr[0] != "localhost"
        key = _derived_secret(
            f"{info.source}:{job_id}:{info.size}:{where}", info.rank == 0, exposed, info.source
        )
    if info.rank == 0:
        warn_unknown_variables(env)
    if secret is not None and not secret:
        raise InvalidArgumentError("secret= must not be empty")
    return dataclasses.replace(
        info,
        store_addr=addr,
        store_path=path,
        secret=key,
        job_id=job_id,
        host_store=host_store and addr is not None,
    )


def usable_cpus() -> list[int]:
    """The processor cores this process may run on, in order (its affinity mask where the
    platform has one, else every core of the machine)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """The number of processor cores this process may run on (:func:`usable_cpus`)."""
    return len(usable_cpus())


def host_cores() -> int:
    """The number of cores this host's ranks of the job run on together: the launcher's
    count where it bound each rank to a share of them (``UNISON_HOST_CORES``, set with
    ``UNISON_CPUS``), else this process's own (:func:`usable_cores`). Whether a host's
    ranks outnumber its cores is a question about all of them: a bound rank's own mask
    holds only its share."""
    text = os.environ.get(C.ENV_HOST_CORES, "").strip()
    if text.isdigit() and int(text) > 0 and os.environ.get(C.ENV_CPUS):
        return int(text)
    return usable_cores()
