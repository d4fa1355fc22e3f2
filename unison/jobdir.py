"""Removing the file-store directory that :mod:`unison.jobenv` derived for a job.

Under a launcher that gives no store address (a user's own ``mpirun``, MPICH/Intel MPI),
ranks meet in a :class:`~unison.store.FileStore` at ``/tmp/unison-<job>``, a directory
nobody else would remove. Each rank that uses such a derived directory counts itself
out when its interpreter exits (normally or through an exception; :func:`release_all`,
called by :mod:`unison.world`'s exit hook after the job is shut down): it writes
``.exit-<rank>`` under the directory's lock, and the last of the ranks sharing the
directory removes it. A rank killed by a signal (``SIGKILL``, or ``SIGTERM`` from
``mpirun`` after another rank failed) runs no exit code: its job's directory stays,
and ``rm -rf /tmp/unison-ompi-*`` once no job runs is safe. A directory the user named
(``UNISON_STORE_PATH``) is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Mapping

from . import config as C
from .errors import InvalidArgumentError
from .log import get_logger

__all__ = ["count_out", "derived_store_path", "release_all", "release_at_exit"]

_log = get_logger("launch")

_pending: dict[str, tuple[int, int]] = {}  # path -> (rank, ranks sharing it)


def count_out(path: str, rank: int, ranks: int) -> bool:
    """Record that ``rank`` is done with the job directory ``path`` shared by ``ranks``
    ranks; the last one removes it. True when this call removed it."""
    try:
        fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            os.close(os.open(os.path.join(path, f".exit-{rank}"), os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            done = sum(1 for n in os.listdir(path) if n.startswith(".exit-"))
        except OSError:
            return False
        if done < ranks:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def release_at_exit(path: str, rank: int, ranks: int) -> None:
    """Count ``rank`` out of the derived job directory ``path`` when this process exits."""
    _pending[path] = (rank, ranks)


def release_all() -> None:
    """Count this process out of every derived job directory it used (at exit)."""
    while _pending:
        path, (rank, ranks) = _pending.popitem()
        count_out(path, rank, ranks)


def derived_store_path(
    env: Mapping[str, str], source: str, job_id: str, rank: int, size: int, local_size: int | None
) -> str:
    """``/tmp/unison-<job>``: the file store of a job whose launcher gives no store address
    (and no ``UNISON_STORE_PATH``); removed by the last rank out when ``env`` is this
    process's own environment."""
    if not job_id:
        raise InvalidArgumentError(
            f"cannot tell this {source} job's id for a file store: set "
            f"UNISON_STORE_PATH (a directory every rank sees) or {C.ENV_STORE_ADDR}"
        )
    path = f"/tmp/unison-{job_id}"
    if env is os.environ:
        release_at_exit(path, rank, local_size or size)
    if local_size is not None and local_size < size:
        _log.warning(
            "job spans hosts but the file store %s is host-local; set "
            "UNISON_STORE_PATH to a shared directory",
            path,
        )
    return path
