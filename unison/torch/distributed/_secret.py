"""The peer secret of a job started by ``init_process_group("unison")``.

The ranks authenticate each other with unison's mutual HMAC handshake, keyed by a
secret. torch's store cannot carry that secret: it has no authentication, any local
user can read and write it (a ``TCPStore`` listens on every interface). So the secret
never goes into the store:

* ``UNISON_SECRET`` set (``unison run`` exports the launcher's own secret to every
  rank; a user may export one on every host): the ranks use it.
* Otherwise rank 0 draws a random secret and writes it to a file that only its user
  can read (mode 0600, in a directory of that user's of mode 0700); the store gets
  only the file's name. Every other rank reads the file, so it must run as the same
  user and see the same file system (one host). The file is removed as soon as every
  rank has connected (a killed rank 0 leaves it; the next job's rank 0 removes the
  files of processes that are gone).

A rank that cannot read the file (another host, another user) fails with
:class:`~unison.errors.AuthenticationError` telling to export ``UNISON_SECRET``.
Addresses in the store need no protection of their own: the handshake proves both
ends know the secret, so a replaced address reaches no one who can pass it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import tempfile
from dataclasses import dataclass

from ... import config as C
from ...bootstrap import host_identity
from ...errors import AuthenticationError
from ...jobenv import secret_from_env
from ...store import Store

__all__ = ["JobSecret", "job_secret", "private_dir"]

#: store key under which rank 0 publishes the secret file's name (never its content)
FILE_KEY = "unison/c10d/secret-file"
_NAME = re.compile(r"c10d-(\d+)-([0-9a-f]{32})")
_SECRET_BYTES = 32


@dataclass
class JobSecret:
    """The job's peer secret, the job id the handshake binds, and the file to remove."""

    secret: bytes
    job_id: str
    path: str | None = None  # rank 0's secret file, removed by :meth:`release`

    def release(self) -> None:
        """Remove the secret file (rank 0, once every rank has connected)."""
        if self.path is not None:
            path, self.path = self.path, None
            with contextlib.suppress(OSError):
                os.unlink(path)


def private_dir() -> str:
    """This user's directory for secret files: created 0700 if missing; refused if it
    is not a directory owned by this user that nobody else may enter."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = os.path.join(runtime, "unison") if runtime else None
    if base is None or not os.path.isdir(runtime):
        base = os.path.join(tempfile.gettempdir(), f"unison-{uid}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise AuthenticationError(
            f"c10d: {base} must be a directory of uid {uid} with mode 0700 (it holds job "
            f"secrets); it is {'a directory' if stat.S_ISDIR(st.st_mode) else 'no directory'} "
            f"of uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}"
        )
    return base


def _sweep(directory: str) -> None:
    """Remove the secret files of rank-0 processes that are gone (killed before removal)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            m = _NAME.fullmatch(name)
            if m is None:
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
            except OSError:
                pass  # alive (another user's pid): keep


def _create(directory: str) -> tuple[str, str, bytes]:
    token = secrets.token_hex(16)
    name = f"c10d-{os.getpid()}-{token}"
    path = os.path.join(directory, name)
    secret = secrets.token_bytes(_SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret)
    finally:
        os.close(fd)
    return name, token, secret


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise AuthenticationError(
                f"c10d: {path} is not a private file of this user; refusing it as the job secret"
            )
        data = os.read(fd, _SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != _SECRET_BYTES:
        raise AuthenticationError(f"c10d: {path} does not hold a job secret")
    return data


def job_secret(store: Store, rank: int, timeout: float) -> JobSecret:
    """The secret every rank of the job uses, obtained without the store seeing it."""
    env_secret = secret_from_env(os.environ)
    if env_secret is not None:
        job_id = os.environ.get(C.ENV_JOB_ID, "").strip() or "c10d"
        return JobSecret(env_secret, job_id)
    directory = private_dir()
    if rank == 0:
        _sweep(directory)
        name, token, secret = _create(directory)
        record = {"name": name, "host": host_identity()}
        path = os.path.join(directory, name)
        try:
            store.set(FILE_KEY, json.dumps(record).encode())
        except BaseException:
            os.unlink(path)
            raise
        return JobSecret(secret, f"c10d-{token}", path)
    raw = store.get(FILE_KEY, timeout=timeout)
    try:
        record = json.loads(raw.decode())
        name, host = str(record["name"]), str(record["host"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise AuthenticationError(
            f"c10d: rank {rank}: the store's {FILE_KEY!r} is not unison's record"
        ) from None
    m = _NAME.fullmatch(name)
    if m is None:
        raise AuthenticationError(f"c10d: rank {rank}: {name!r} is no secret file name")
    try:
        secret = _read(os.path.join(directory, name))
    except FileNotFoundError:
        where = (
            "rank 0 runs on another host"
            if host != host_identity()
            else "rank 0 runs as another user, or with another temporary directory"
        )
        raise AuthenticationError(
            f"c10d: rank {rank} cannot read the job secret that rank 0 keeps in "
            f"{os.path.join(directory, name)} ({where}). Set the same {C.ENV_SECRET}=<hex> "
            f"on every rank (or start the job with `unison run`), e.g. {C.ENV_SECRET}="
            '$(python -c "import secrets; print(secrets.token_hex(32))")'
        ) from None
    return JobSecret(secret, f"c10d-{m.group(2)}")
