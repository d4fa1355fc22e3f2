"""The ``native`` backend: unison's own algorithms over its own transports.

:class:`Runtime` (``runtime.py``) joins the job: store, mesh, fabric, groups.
:class:`NativeBackend` (``backend.py``) picks each call's algorithm by cost and
submits it to the group's :class:`Executor` (``executor.py``), the one owner of the
group's run state, which runs it in issue order, checks signatures (``desync.py``;
a two-rank group's broadcasts by message in batches, ``receipts.py``) and spreads
failures. Small collectives of a one-host job go over the shared slots
(``slot_collectives.py``), blocking ones in the caller's thread through the
executor's caller-thread entry. ``p2p.py`` posts sends and receives and
``fabric.py`` routes every peer to shared memory or TCP; ``shm_setup.py`` sets up
the shared memory (segments, the peers' mappings, arenas and slots) and
``setup_exchange.py`` carries the set-up messages over TCP.
"""

from __future__ import annotations

import os

from ...config import Config
from ...jobenv import JobInfo, detect_job
from ...log import set_rank
from .backend import NativeBackend
from .runtime import Runtime

__all__ = ["NativeBackend", "Runtime", "open_runtime", "start_runtime"]


def open_runtime(
    config: Config,
    *,
    rank: int | None = None,
    size: int | None = None,
    store_addr: str | tuple[str, int] | None = None,
    secret: bytes | str | None = None,
) -> Runtime:
    """Join the job on unison's own engine: who we are (``unison run``, torchrun, mpirun,
    Slurm or explicit arguments), then the store, the mesh and the world group."""
    if isinstance(store_addr, str):
        host, _, port = store_addr.rpartition(":")
        store_addr = (host, int(port))
    if isinstance(secret, str):
        secret = bytes.fromhex(secret)
    job = detect_job(os.environ, rank=rank, size=size, store_addr=store_addr, secret=secret)
    set_rank(job.rank)
    return start_runtime(job, config)


def start_runtime(job: JobInfo, config: Config) -> Runtime:
    """A started runtime for ``job``; one that fails to start is closed again."""
    rt = Runtime(job, config)
    try:
        rt.start()
    except BaseException:
        rt.close()
        raise
    return rt
