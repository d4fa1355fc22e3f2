"""One rank's shared-memory segment: its doorbell, its inbound rings, its slot.

Every rank creates exactly one segment, ``/dev/shm/unison-<job>-r<rank>-<token>``,
sized once at start-up: a header page (the doorbell futex word and the
"sleeping" flag), one single-producer/single-consumer ring per local peer (the
peer writes, this rank reads), and a fixed *slot* that direct collective
algorithms read and reduce in place. The owner unlinks the file as soon as
every peer has mapped it, so a rank killed afterwards leaves nothing behind;
the launcher removes ``unison-<job>-*`` for the short window before that.

Layout (offsets in bytes; 64-byte cache lines keep writers apart)::

    0      doorbell u32 (bumped by anyone who hands this rank work)
    64     sleeping u32 (1 while this rank's progress thread sleeps on the doorbell)
    4096   ring i: head u64 @+0 (peer writes), tail u64 @+64 (owner writes), data @+128
    ...    slot (page aligned)
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "SHM_DIR",
    "Layout",
    "Segment",
    "cleanup_job",
    "cleanup_orphans",
    "reserve",
    "segment_prefix",
]

SHM_DIR = "/dev/shm"
_PAGE = 4096
RING_CTL = 128


def segment_prefix(job_id: str) -> str:
    """The file-name prefix every segment of ``job_id`` starts with."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id or "nojob")[:64]
    return f"unison-{safe}-"


def cleanup_job(job_id: str, directory: str = SHM_DIR) -> list[str]:
    """Remove segments a job left (ranks killed before unlinking). Returns the names."""
    prefix = segment_prefix(job_id)
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


#: a segment's name: prefix, owner's rank, pid and a random token (see Segment.create)
_NAME = re.compile(r"unison-.*-r\d+-(\d+)-[0-9a-f]+")


def cleanup_orphans(directory: str = SHM_DIR) -> list[str]:
    """Remove segments of this user whose owner process is gone (killed between
    creating and unlinking its segment, with no launcher to clean after it: torchrun,
    mpirun). A segment is unlinked by its owner as soon as its peers mapped it, so a
    name whose owner is dead maps nothing anyone still waits for. Returns the names."""
    removed: list[str] = []
    uid = os.geteuid()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != uid:
                continue
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
        except OSError:
            pass  # gone already, or a live process of another user
    return removed


def reserve(
    fd: int,
    size: int,
    directory: str = SHM_DIR,
    offset: int = 0,
    what: str = "segment",
    needs: int | None = None,
) -> None:
    """Allocate ``size`` bytes of the segment's pages from ``offset`` now, so a short
    /dev/shm (Docker's default is 64 MB) fails here with a clear error instead of SIGBUS
    in the middle of a collective. Pages allocated are not resident in any process until
    touched. ``needs``: the bytes the error names (default ``size``; a segment allocated
    in several ranges names their sum)."""
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return  # the file system cannot preallocate: nothing to check
            raise
        try:
            st = os.statvfs(directory)
            mb = st.f_frsize / 2**20
            free = f"{st.f_bavail * mb:.0f} MB free of {st.f_blocks * mb:.0f} MB"
        except OSError:
            free = "free space unknown"
        mb_needed = (size if needs is None else needs) / 2**20
        raise OSError(
            exc.errno,
            f"{directory} is too small: this rank's shared-memory {what} needs "
            f"{mb_needed:.1f} MB ({free}); give the host or container more "
            "(e.g. docker run --shm-size=1g) or use TCP inside the host with "
            "UNISON_TRANSPORT=tcp",
        ) from None


@dataclass(frozen=True)
class Layout:
    """Where the rings and the slot are; sent to peers in the hello."""

    size: int
    rings: dict[int, int]  # sender rank -> offset of its ring in this segment
    ring_bytes: int
    slot_offset: int
    slot_bytes: int


def layout_of(peers: list[int], ring_bytes: int, slot_bytes: int) -> Layout:
    """Where a segment for ``peers`` holds each peer's ring and, after them, the slot."""
    rings, off = {}, _PAGE
    for p in sorted(peers):
        rings[p] = off
        off += RING_CTL + ring_bytes
    slot_off = (off + _PAGE - 1) // _PAGE * _PAGE
    return Layout(slot_off + slot_bytes, rings, ring_bytes, slot_off, slot_bytes)


class Segment:
    """A mapped segment: created (and later unlinked) by its owner, attached by peers."""

    def __init__(self, path: str, mm: mmap.mmap, owner: bool, fd: int = -1) -> None:
        self.path = path
        self.mm = mm
        self.owner = owner
        #: the owner's open file (kept after the unlink: :meth:`reserve` needs it); -1: none
        self.fd = fd
        self.unlinked = not owner
        self.bell = ctypes.c_uint32.from_buffer(mm, 0)
        self.sleeping = ctypes.c_uint32.from_buffer(mm, 64)
        self.bell_addr = ctypes.addressof(self.bell)

    @classmethod
    def create(
        cls,
        job_id: str,
        rank: int,
        size: int,
        reserved: Sequence[tuple[int, int]] | None = None,
    ) -> Segment:
        """A new segment of ``size`` bytes whose ``reserved`` ranges, (offset, length)
        each (default: all of it), are allocated now; the rest is allocated by
        :meth:`reserve` before first use."""
        name = f"{segment_prefix(job_id)}r{rank}-{os.getpid()}-{secrets.token_hex(4)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            ranges = [(0, size)] if reserved is None else reserved
            needs = sum(length for _, length in ranges)
            for offset, length in ranges:
                if length > 0:
                    reserve(fd, length, offset=offset, needs=needs)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(path, mm, owner=True, fd=fd)

    @classmethod
    def attach(cls, path: str, size: int) -> Segment:
        if os.path.dirname(path) != SHM_DIR or not os.path.basename(path).startswith("unison-"):
            raise OSError(f"refusing to map {path!r}: not a unison segment")
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != size:
                raise OSError(f"{path}: size differs from the announced {size} bytes")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, mm, owner=False)

    def u64(self, offset: int) -> ctypes.c_uint64:
        return ctypes.c_uint64.from_buffer(self.mm, offset)

    def view(self, offset: int, length: int) -> memoryview:
        return memoryview(self.mm)[offset : offset + length]

    def reserve(
        self, offset: int, length: int, what: str = "segment", needs: int | None = None
    ) -> None:
        """Allocate ``length`` bytes from ``offset`` (the owner only; OSError when
        /dev/shm has no room, naming ``needs`` bytes, default ``length``); nothing in the
        range may be touched before this succeeded."""
        if self.fd < 0:
            raise OSError(f"{self.path}: only its owner can allocate its pages")
        reserve(self.fd, length, offset=offset, what=what, needs=needs)

    def close(self) -> None:
        """Close the owner's file (the mapping stays valid)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def unlink(self) -> None:
        """Remove the name (the owner only); mappings stay valid."""
        if self.owner and not self.unlinked:
            self.unlinked = True
            try:
                os.unlink(self.path)
            except OSError:
                pass
