"""torch's ``env://`` rendezvous under mpirun and Slurm: the variables torchrun would set.

torch's default rendezvous (``env://``) reads ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``; ``mpirun`` and ``srun`` set none of them, so an
unchanged ``init_process_group(...)`` fails there before any backend is created.
``import unison.torch.distributed`` wraps torch's ``env://`` handler: when the
rendezvous runs, a variable that is absent is filled in from the launcher that
unison detects (:mod:`unison.jobenv`: Open MPI, MPICH/Intel MPI's PMI, Slurm),
then torch's own handler runs unchanged. Variables already set are never touched,
and nothing is filled under torchrun or ``unison run`` (they set all of them).

* ``RANK``, ``WORLD_SIZE``; ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``
  where the launcher tells them.
* ``MASTER_ADDR``: under Slurm the first host of the step's node list (as Lightning
  and most Slurm recipes do); under mpirun with every rank on one host
  ``127.0.0.1``. A multi-host mpirun gives no address every rank can derive:
  export it (``mpirun -x MASTER_ADDR=<rank 0's host> ...``) or torch names it missing.
* ``MASTER_PORT``: derived from the job's identity (Slurm job and step ids, Open
  MPI's job namespace), identical on every rank without any exchange, in
  [30000, 32700): outside Linux's ephemeral ports and outside the range unison's
  own Slurm store uses. Export ``MASTER_PORT`` to choose another.

The wrapper works for every backend (``gloo`` as well as ``unison``), since the
rendezvous runs before the backend is created. Filling at rendezvous time rather
than at import keeps ``unison.init()`` (which reads the same launcher variables)
unaffected by the import.
"""

from __future__ import annotations

import importlib
import os
import zlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from ...errors import InvalidArgumentError
from ...jobenv import JobInfo, expand_nodelist, from_openmpi, from_pmi, from_slurm

__all__ = ["PORT_BASE", "PORT_SPAN", "install", "launcher_env"]

PORT_BASE = 30000
PORT_SPAN = 2700


def _slurm_master(env: MutableMapping[str, str]) -> str | None:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        nodes = env.get(name, "").strip()
        if nodes:
            hosts = expand_nodelist(nodes)
            return hosts[0] if hosts else None
    return None


def _slurm_id(env: MutableMapping[str, str]) -> str | None:
    job = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    if not job:
        return None
    return f"slurm-{job}.{env.get('SLURM_STEP_ID', '0').strip() or '0'}"


def launcher_env(env: MutableMapping[str, str]) -> dict[str, str]:
    """The torchrun variables absent from ``env`` that its launcher determines
    (empty under torchrun, ``unison run`` or no launcher)."""
    if ("RANK" in env and "WORLD_SIZE" in env) or "UNISON_RANK" in env:
        return {}
    info: JobInfo | None = None
    for convention in (from_openmpi, from_pmi, from_slurm):
        try:
            info = convention(env)
        except InvalidArgumentError:  # malformed launcher variables: torch names what is missing
            return {}
        if info is not None:
            break
    if info is None:
        return {}
    under_srun = env.get("SLURM_PROCID", "").strip() == str(info.rank)
    want: dict[str, str] = {"RANK": str(info.rank), "WORLD_SIZE": str(info.size)}
    if info.local_rank is not None:
        want["LOCAL_RANK"] = str(info.local_rank)
    if info.local_size is not None:
        want["LOCAL_WORLD_SIZE"] = str(info.local_size)
    if info.cross_rank is not None:
        want["GROUP_RANK"] = str(info.cross_rank)
    if under_srun:
        master, job = _slurm_master(env), _slurm_id(env)
    else:
        one_host = info.local_size is not None and info.local_size == info.size
        master, job = ("127.0.0.1" if one_host else None), (info.job_id or None)
    if master is not None:
        want["MASTER_ADDR"] = master
    if job is not None:
        want["MASTER_PORT"] = str(PORT_BASE + zlib.crc32(job.encode()) % PORT_SPAN)
    return {k: v for k, v in want.items() if not env.get(k)}


def _wrap(handler: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def env_from_launcher(url: str, **kwargs: Any) -> Iterator[Any]:
        os.environ.update(launcher_env(os.environ))
        return handler(url, **kwargs)

    env_from_launcher._unison_wraps = handler  # type: ignore[attr-defined]
    env_from_launcher.__doc__ = handler.__doc__
    return env_from_launcher


def install() -> bool:
    """Wrap torch's ``env://`` rendezvous handler (once). False where torch has none."""
    # ``torch.distributed.rendezvous`` is also a function the package exports: the module
    rdzv = importlib.import_module("torch.distributed.rendezvous")

    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or "env" not in handlers:
        return False
    if not hasattr(handlers["env"], "_unison_wraps"):
        handlers["env"] = _wrap(handlers["env"])
    return True
