"""Joining unison from torch's backend constructor, and one unison Group per torch group."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torch.distributed.constants import default_pg_timeout

from ... import world as _w
from ...backends.native import runtime as _rt
from ...comm.group import Group
from ...config import ENV_JOB_ID, Config, load_config
from ...errors import InvalidArgumentError
from ...jobenv import JobInfo, launcher_layout
from ...log import configure, set_rank
from ...store import Store
from ...transport.shm_segment import cleanup_orphans
from ._secret import job_secret
from ._store import TorchStore

__all__ = ["communicator", "join"]

_LOCK = threading.Lock()
#: whether this module started the runtime (then the default group's shutdown ends it)
OWNED = {"runtime": False}


class _TorchRuntime(_rt.Runtime):
    """A unison runtime whose rendezvous store is the one torch connected."""

    def __init__(self, job: JobInfo, store: Store, config: Config) -> None:
        super().__init__(job, config)
        self._torch_store = store

    def _open_store(self) -> Store:
        return self._torch_store

    def close(self) -> None:
        # torch owns the store and its server: no leaving handshake through it (the
        # rank hosting it may already be gone)
        self.store = None
        super().close()
        if not os.environ.get(ENV_JOB_ID):
            cleanup_orphans()  # a peer killed during start-up may have left its segment


def explicit_timeout(timeout: timedelta | None) -> bool:
    """Whether ``timeout`` is the caller's own: torch hands every backend its default
    (``torch.distributed.constants.default_pg_timeout``, 30 minutes) when the caller
    gave none, and that must not replace unison's configured deadline (``unison run
    --timeout``, ``UNISON_TIMEOUT``). A caller who passes exactly the default gets
    unison's deadline too: the two cannot be told apart."""
    if timeout is None or timeout == default_pg_timeout:
        return False
    return timeout.total_seconds() > 0


def join(store: Any, rank: int, size: int, timeout: timedelta) -> _rt.Runtime:
    """The unison runtime of this process, started through torch's ``store`` if needed."""
    with _LOCK:
        if _w.is_initialized():
            rt = _w.current()
            if not isinstance(rt, _rt.Runtime):
                raise InvalidArgumentError(
                    "unison is initialized with an external backend; the c10d backend "
                    "'unison' needs unison's own engine (unison.init(backend='native'))"
                )
            if rt.size != size or rt.rank != rank:
                raise InvalidArgumentError(
                    f"unison is initialized as rank {rt.rank} of {rt.size}, but torch.distributed "
                    f"creates its default group as rank {rank} of {size}"
                )
            return rt
        if not os.environ.get(ENV_JOB_ID):
            # no launcher of unison's to remove the shared memory of ranks killed before
            # they unlinked it (torchrun, mpirun): the next job on the host does
            cleanup_orphans()
        cfg = load_config()
        if explicit_timeout(timeout):
            cfg = cfg.replace(timeout=timeout.total_seconds())
        ustore = TorchStore(store, cfg.timeout)
        key = job_secret(ustore, rank, cfg.timeout)
        # the launcher's word on this host's ranks (torchrun's LOCAL_WORLD_SIZE, ...), where
        # it launched this rank: the runtime then prepares shared memory while connecting
        local_rank, local_size = launcher_layout(os.environ, rank, size)
        job = JobInfo(
            rank=rank,
            size=size,
            local_rank=local_rank,
            local_size=local_size,
            cross_rank=None,
            cross_size=None,
            store_addr=None,
            store_path=None,
            secret=key.secret,
            job_id=key.job_id,
            host_store=False,
            source="torch.distributed",
        )
        configure(cfg.log_level)
        set_rank(rank)
        rt = _TorchRuntime(job, ustore, cfg)
        try:
            rt.start()
        except BaseException:
            rt.close()
            raise
        finally:
            key.release()  # every rank has connected (or the start failed): not needed
        with _w._LOCK:
            _w._RT = rt
        OWNED["runtime"] = True
        return rt


def leave() -> None:
    """End the runtime this module started (the default group was destroyed)."""
    with _LOCK:
        if OWNED["runtime"]:
            OWNED["runtime"] = False
            _w.shutdown()


def communicator(
    rt: _rt.Runtime,
    group_name: str,
    ranks: Sequence[int],
    default: bool,
    timeout: timedelta | None = None,
) -> Group:
    """The unison Group of the torch group ``group_name`` over global ``ranks``.

    torch creates a backend only on the group's members, so the group id cannot
    come from unison's own collective ``new_group`` counter: it is derived from
    torch's group name, which every member agrees on. A sub-group's ``timeout``
    (``new_group(timeout=...)``, when the caller gave one: :func:`explicit_timeout`)
    is the deadline of every operation on it, as unison's ``new_group(timeout=...)``.
    """
    members = sorted(int(r) for r in ranks)
    if default:
        return rt.world
    gid = 0x40000000 | (zlib.crc32(f"{group_name}/{members}".encode()) & 0x3FFFFFFF)
    own = timeout.total_seconds() if timeout is not None and explicit_timeout(timeout) else None
    return rt.group(gid, members, timeout=own)
