"""The environment each rank starts with: unison's, Horovod's and torchrun's variables,
a share of the host's cores as every framework's thread count (torchrun's habit), and
the cores themselves as the rank's binding (mpirun's habit)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from .. import config as C
from ..jobenv import usable_cores, usable_cpus
from .hosts import Slot
from .output import isatty

__all__ = [
    "THREAD_VARIABLES",
    "binding_environment",
    "binding_of",
    "cpu_share",
    "rank_environment",
    "thread_environment",
    "thread_share",
    "thread_notice",
    "usable_cores",
    "usable_cpus",
]

#: the compute-thread counts frameworks read from the environment at start: OpenMP
#: (torch's intra-op pool, numpy's BLAS), MKL, OpenBLAS and TensorFlow's intra-op pool.
#: TensorFlow's inter-op pool is left alone: it schedules ops rather than computing, and
#: unison.tensorflow needs it wide (each graph-mode collective waits on one of its threads)
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
)


def thread_share(base: Mapping[str, str], local_size: int) -> int:
    """How many ranks divide their host's cores among them: ``local_size``, or 0 when
    the thread counts are left alone (one rank has the host, or ``base`` sets one of
    :data:`THREAD_VARIABLES`: the user chose). A launcher that starts a rank on another
    host, whose cores only that host knows, sends this number along; the process that
    starts the rank there applies :func:`thread_environment` with its own core count."""
    if local_size <= 1 or any(base.get(name) for name in THREAD_VARIABLES):
        return 0
    return local_size


def thread_environment(base: Mapping[str, str], local_size: int, cores: int) -> dict[str, str]:
    """Each of :data:`THREAD_VARIABLES` set to ``cores // local_size`` (at least 1), for
    a rank that shares its host with ``local_size - 1`` others; nothing where
    :func:`thread_share` says so (one rank has the host, or ``base`` sets any of them)."""
    n = thread_share(base, local_size)
    if not n:
        return {}
    return dict.fromkeys(THREAD_VARIABLES, str(max(1, cores // n)))


def thread_notice(
    base: Mapping[str, str],
    local_size: int,
    cores: int,
    how: str = "-x OMP_NUM_THREADS=N",
    bound: bool = False,
) -> str | None:
    """The one line said when the thread counts are set, else None; ``how`` is the way
    this launcher's user sets one of them; ``bound``: each rank is also bound to its
    share of the cores (:func:`cpu_share`)."""
    threads = thread_environment(base, local_size, cores)
    if not threads:
        return None
    n = threads["OMP_NUM_THREADS"]
    if not bound:
        where = ""
    elif local_size > cores:
        where = f" on one core, {-(-local_size // cores)} ranks a core"
    else:
        where = f" on {'its own core' if n == '1' else f'its own {n} cores'}"
    unbind = " (--bind-to none: unbound)" if bound else ""
    return (
        f"{local_size} ranks share this host's {cores} cores: each runs "
        f"OMP_NUM_THREADS={n} (and MKL_, OPENBLAS_, TF_NUM_INTRAOP_THREADS){where}; set "
        f"one of them ({how}) to choose{unbind}"
    )


def cpu_share(
    base: Mapping[str, str], local_rank: int, local_size: int, cpus: Sequence[int]
) -> list[int] | None:
    """The cores rank ``local_rank`` of a host's ``local_size`` ranks is bound to: its own
    run of ``cpus`` (the host's usable cores, in order), ``len(cpus) // local_size`` of
    them, as mpirun binds ranks to cores. A rank that shares its core with no other rank
    cannot be stacked by the scheduler onto another rank's core (which a rank that sleeps
    while it waits invites, and which costs a context switch per message); its threads
    (the thread count, :func:`thread_environment`) stay on its own cores.

    Where the ranks outnumber the cores, each rank gets one core, and neighbours in rank
    order share one (ranks 0 and 1 the first of two cores, 2 and 3 the second): the
    ranks of a core take turns on it instead of following each other from core to core.

    None (not bound) when one rank has the host, with ``UNISON_BIND=none``, and with
    ``UNISON_BIND=auto`` (the default) when the user set a thread count
    (:func:`thread_share`): threads beyond the share would queue on it."""
    mode = (base.get("UNISON_BIND") or "auto").strip().lower()
    if mode == "none" or local_size < 2 or not cpus:
        return None
    if mode != "core" and not thread_share(base, local_size):
        return None
    n = len(cpus)
    if local_size > n:
        return [cpus[local_rank * n // local_size]]
    k = n // local_size
    return list(cpus[local_rank * k : (local_rank + 1) * k])


def binding_environment(
    base: Mapping[str, str], local_rank: int, local_size: int, cpus: Sequence[int]
) -> dict[str, str]:
    """``UNISON_CPUS`` (the rank's cores, :func:`cpu_share`) and ``UNISON_HOST_CORES`` (how
    many the host's ranks share) for a rank to be bound; nothing for one that is not. The
    process that starts the rank binds it (:func:`unison.launch.supervise.start_rank`)."""
    share = cpu_share(base, local_rank, local_size, cpus)
    if share is None:
        return {}
    return {C.ENV_CPUS: ",".join(map(str, share)), C.ENV_HOST_CORES: str(len(cpus))}


def binding_of(env: Mapping[str, str]) -> list[int] | None:
    """The cores a rank started with environment ``env`` is bound to (``UNISON_CPUS``, of
    :func:`binding_environment`), or None where it is unset or not a list of cores."""
    text = env.get(C.ENV_CPUS)
    if not text:
        return None
    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        return None
    return cpus if cpus and min(cpus) >= 0 else None


def rank_environment(
    base: Mapping[str, str],
    *,
    rank: int,
    size: int,
    store: tuple[str, int],
    secret: bytes,
    job_id: str,
    timeout: float | None = None,
    servers: int = 0,
    slot: Slot | None = None,
    network_interface: str | None = None,
    master: tuple[str, int] | None = None,
    cpus: Sequence[int] | None = None,
) -> dict[str, str]:
    """The environment of one rank (the last ``servers`` ranks serve); ``slot`` places it
    on a host of a multi-host job (else every rank shares this host). ``cpus``: the
    usable cores of the rank's host, divided among its ranks as their thread counts
    (:func:`thread_environment`) and their bindings (:func:`binding_environment`); None
    leaves both alone."""
    env = dict(base)
    for name in (C.ENV_CPUS, C.ENV_HOST_CORES):  # a launcher's own binding is not the rank's
        env.pop(name, None)
    slot = slot or Slot(rank, "localhost", rank, size, 0, 1)
    ident = {
        "RANK": rank,
        "SIZE": size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_SIZE": slot.local_size,
        "CROSS_RANK": slot.cross_rank,
        "CROSS_SIZE": slot.cross_size,
    }
    for name, value in ident.items():
        env[f"UNISON_{name}"] = str(value)
        env[f"HOROVOD_{name}"] = str(value)
    # torchrun's variables, so an unchanged torch.distributed script runs (env://)
    torchrun = {
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_WORLD_SIZE": slot.local_size,
        "GROUP_RANK": slot.cross_rank,
        "GROUP_WORLD_SIZE": slot.cross_size,
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": size,
        "ROLE_NAME": "default",
    }
    env.update({k: str(v) for k, v in torchrun.items()})
    if master is not None:
        env["MASTER_ADDR"], env["MASTER_PORT"] = master[0], str(master[1])
    env[C.ENV_STORE_ADDR] = f"{store[0]}:{store[1]}"
    env[C.ENV_SECRET] = secret.hex()
    env[C.ENV_JOB_ID] = job_id
    env["HOROVOD_HOSTNAME"] = slot.host
    if network_interface:
        env["UNISON_NETWORK_INTERFACE"] = network_interface
    env["PYTHONUNBUFFERED"] = "1"
    env[C.ENV_OUTPUT_TTY] = "1" if isatty(sys.stderr) else "0"
    if cpus is not None:
        env.update(thread_environment(base, slot.local_size, len(cpus)))
        env.update(binding_environment(base, slot.local_rank, slot.local_size, cpus))
    if timeout is not None:
        env["UNISON_TIMEOUT"] = repr(float(timeout))
    if servers:
        env[C.ENV_NUM_SERVERS] = str(servers)
        env[C.ENV_ROLE] = "server" if rank >= size - servers else "worker"
    return env
