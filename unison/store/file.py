"""A store on a directory, for launchers that give no store address (mpirun, Slurm).

Each key is one file named by the SHA-256 of the key. Writes go to a temporary file
renamed into place, so a reader sees the old value or the new one, never half.
Read-modify-write operations (``add``, ``compare_set``, ``delete``) hold an
exclusive ``flock`` on ``<dir>/.lock``. ``get``/``wait`` poll with short sleeps that
grow to 50 ms and end at the deadline. The directory must be shared by every rank
(one host, or a shared filesystem that honours ``flock`` and ``rename``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Iterator, Sequence

from ..errors import InvalidArgumentError, StoreError
from .base import Store, missing_keys_error

__all__ = ["FileStore"]

_MIN_SLEEP = 0.001
_MAX_SLEEP = 0.05


class FileStore(Store):
    """A :class:`Store` kept in the directory ``path`` (created if missing, mode 0700)."""

    def __init__(self, path: str, timeout: float = 300.0) -> None:
        if not path:
            raise InvalidArgumentError("FileStore needs a directory path")
        self.path = os.path.abspath(path)
        self.timeout = self._timeout(timeout)
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create file store directory {self.path}: {exc}") from None
        st = os.stat(self.path)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            # someone else could plant or rewrite keys (a pre-created /tmp directory)
            raise StoreError(
                f"file store directory {self.path} is not owned by this user or is writable "
                "by others; refusing to trust it"
            )
        self._lock_path = os.path.join(self.path, ".lock")
        self._closed = False

    def _file(self, key: str) -> str:
        digest = hashlib.sha256(self._check_key(key).encode("utf-8")).hexdigest()
        return os.path.join(self.path, "k-" + digest)

    def _live(self) -> None:
        if self._closed:
            raise StoreError(f"file store {self.path} is closed")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._live()
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self, key: str) -> bytes | None:
        try:
            with open(self._file(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"file store {self.path}: cannot read {key!r}: {exc}") from None

    def _write(self, key: str, value: bytes) -> None:
        final = self._file(key)
        tmp = f"{final}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(value)
            os.replace(tmp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"file store {self.path}: cannot write {key!r}: {exc}") from None

    def _poll(self, keys: list[str], deadline: float, timeout: float) -> None:
        """Sleep until every key exists or the deadline passes (then raise)."""
        sleep = _MIN_SLEEP
        missing = [k for k in keys if not os.path.exists(self._file(k))]
        while missing:
            left = deadline - time.monotonic()
            if left <= 0:
                raise missing_keys_error(f"file store {self.path}", missing, timeout)
            time.sleep(min(sleep, left))
            sleep = min(sleep * 2, _MAX_SLEEP)
            missing = [k for k in missing if not os.path.exists(self._file(k))]

    # -- Store ------------------------------------------------------------------------
    def set(self, key: str, value: bytes) -> None:
        key, value = self._check_key(key), self._check_value(value)
        with self._locked():
            self._write(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self._live()
        key, t = self._check_key(key), self._timeout(timeout)
        deadline = time.monotonic() + t
        while True:
            value = self._read(key)
            if value is not None:
                return value
            # deleted between exists() and open(): wait again for what is left
            self._poll([key], deadline, t)

    def add(self, key: str, amount: int) -> int:
        key = self._check_key(key)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidArgumentError(f"add() amount must be an int, got {amount!r}")
        with self._locked():
            raw = self._read(key)
            try:
                new = int((raw or b"0").decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise StoreError(f"value of {key!r} is not an integer") from None
            self._write(key, str(new).encode())
        return new

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key = self._check_key(key)
        expected, desired = self._check_value(expected), self._check_value(desired)
        with self._locked():
            current = self._read(key)
            if (current is None and expected == b"") or current == expected:
                self._write(key, desired)
                return desired
            return expected if current is None else current

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._live()
        t = self._timeout(timeout)
        self._poll(self._check_keys(keys), time.monotonic() + t, t)

    def check(self, keys: Sequence[str]) -> bool:
        self._live()
        return all(os.path.exists(self._file(k)) for k in self._check_keys(keys))

    def delete(self, key: str) -> bool:
        with self._locked():
            try:
                os.unlink(self._file(key))
            except FileNotFoundError:
                return False
            return True

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"
