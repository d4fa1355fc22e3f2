"""The raw measurements behind :mod:`.calibrate`'s link model.

Each function measures one thing on this host, now, and returns seconds (per message
or per byte); :func:`unison.transport.calibrate.measure` assembles them into a
:class:`~unison.transport.calibrate.Calibration`. Kept apart from the cache, lock and
override logic so that each file does one job.
"""

from __future__ import annotations

import functools
import mmap
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .seqslot import SeqSlots

__all__ = [
    "COLD_MAX",
    "COPY",
    "cache_bytes",
    "cold_rates",
    "pair",
    "per_message_overhead",
    "rates",
    "shared_rates",
    "slot_sync",
]

_ROUNDS = 400  # ping-pong round trips per latency measurement
_BATCH = 50  # round trips per batch (the estimate is the best batch)
_DEADLINE_S = 5.0  # a measurement that takes longer is abandoned (defaults are used)
_STREAM = 8 << 20  # bytes streamed for the tcp bandwidth
COPY = 1 << 20  # bytes per array for the in-cache copy, reduction and CMA rates
COLD_MAX = 64 << 20  # largest array for the out-of-cache rates
_PIECE = 4 << 20  # bytes per copy or reduction call (a slot half)
_TRIES = 10  # passes per bandwidth measurement (the estimate is the best one)
_PAGE_BYTES = 4096

_CHILD = r"""
import mmap, os, socket, struct, sys, time
sock_fd, path = int(sys.argv[2]), sys.argv[3]
rounds, stream = int(sys.argv[4]), int(sys.argv[5])
f = open(path, "r+b"); m = mmap.mmap(f.fileno(), 64); s = socket.socket(fileno=sock_fd)
deadline = time.monotonic() + float(sys.argv[6])
# shm ping-pong: wait for seq at offset 0, answer at offset 8
for i in range(1, rounds + 1):
    n = 0
    while struct.unpack_from("q", m, 0)[0] != i:
        n += 1
        if n & 31 == 0:
            os.sched_yield()
            if time.monotonic() > deadline:
                sys.exit(3)
    struct.pack_into("q", m, 8, i)
# tcp ping-pong, then a stream
for i in range(rounds):
    if s.recv(1) != b"x":
        sys.exit(4)
    s.sendall(b"y")
s.sendall(bytes(stream))
s.recv(1)
"""


def _spin_until(m: mmap.mmap, off: int, value: int, deadline: float) -> None:
    n = 0
    while struct.unpack_from("q", m, off)[0] != value:
        n += 1
        if n & 31 == 0:
            os.sched_yield()  # never spin through a time slice the child needs
            if time.monotonic() > deadline:
                raise TimeoutError("calibration peer did not answer")


def cache_bytes() -> int:
    """Bytes of the largest CPU cache (sysfs; 32 MiB where unknown), at least 4 MiB."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in os.listdir(base):
            try:
                with open(os.path.join(base, idx, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
            digits = text.rstrip("KMGkmg")
            if digits.isdigit():
                best = max(best, int(digits) * mult)
    except OSError:
        pass
    return max(best or (32 << 20), 4 << 20)


def rates(size: int) -> tuple[float, float, float]:
    """Seconds per byte of a copy, of ``np.add(a, b, out=a)`` on float32 (a reduction
    into one of its operands, as the direct algorithms do it) and of
    ``process_vm_readv`` (from this process, which the kernel copies like another's;
    0 where unavailable, one call as the single-copy algorithms make), on ``size``-byte
    arrays already touched (page faults are not the copy's cost). Copies and
    reductions go in pieces of :data:`_PIECE` bytes, as the direct algorithms' rounds
    do (one huge ``memcpy`` switches to non-temporal stores, which they never see).
    The three alternate, so a busy moment slows all of them alike; each estimate is
    its best pass."""
    from . import cma

    src = np.ones(size, np.uint8)
    dst = np.ones_like(src)
    a, b = src.view(np.float32), dst.view(np.float32)
    best = [float("inf")] * 3
    use_cma = cma.available()
    step = _PIECE // 4  # copies and reductions go round by round, a slot half at most
    for _ in range(_TRIES):
        t0 = time.perf_counter()
        for i in range(0, size, _PIECE):
            np.copyto(dst[i : i + _PIECE], src[i : i + _PIECE])
        t1 = time.perf_counter()
        for i in range(0, size // 4, step):
            np.add(a[i : i + step], b[i : i + step], out=a[i : i + step])
        t2 = time.perf_counter()
        if use_cma:
            try:
                cma.read_from(os.getpid(), src.ctypes.data, dst)
            except cma.CmaError:
                use_cma = False
        t3 = time.perf_counter()
        for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
            best[i] = min(best[i], dt)
    return best[0] / size, best[1] / size, best[2] / size if use_cma else 0.0


def per_message_overhead() -> float:
    from .._types import OpSig
    from .framing import pack, unpack
    from .matching import Matcher
    from .request import Request

    sig = OpSig()
    matcher = Matcher()
    view = np.zeros(2, np.float32)
    n, best = 400, float("inf")
    for b in range(5):  # best of batches: a preempted batch measures the load, not us
        t = time.perf_counter()
        for i in range(b * n, (b + 1) * n):
            key = (1, 0, i, 0)
            req = Request(1, key, view, sig)
            matcher.post(req)
            frame = unpack(pack(1, 0, i, 0, sig, 8))
            matcher.take_posted(1, frame.key)
            req.complete()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def pair() -> tuple[float, float, float]:
    """(shm α, tcp α, tcp β) from a ping-pong with a child process."""
    deadline = time.monotonic() + _DEADLINE_S
    with tempfile.NamedTemporaryFile(prefix="unison-calib-", dir=_shm_dir()) as f:
        f.write(bytes(64))
        f.flush()
        m = mmap.mmap(f.fileno(), 64)
        a, b = socket.socketpair()
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, "0", str(b.fileno()), f.name, *_child_args()],
            pass_fds=(b.fileno(),),
        )
        b.close()
        try:
            a.settimeout(_DEADLINE_S)
            # best of batches: a batch that lost the core to another process says
            # nothing about the link, so the fastest batch is the estimate
            shm_alpha = tcp_alpha = float("inf")
            for b0 in range(0, _ROUNDS, _BATCH):
                t = time.perf_counter()
                for i in range(b0 + 1, b0 + _BATCH + 1):
                    struct.pack_into("q", m, 0, i)
                    _spin_until(m, 8, i, deadline)
                shm_alpha = min(shm_alpha, (time.perf_counter() - t) / _BATCH / 2)
            for _ in range(0, _ROUNDS, _BATCH):
                t = time.perf_counter()
                for _ in range(_BATCH):
                    a.sendall(b"x")
                    a.recv(1)
                tcp_alpha = min(tcp_alpha, (time.perf_counter() - t) / _BATCH / 2)
            buf = bytearray(1 << 20)
            got = 0
            t = time.perf_counter()
            while got < _STREAM:
                k = a.recv_into(buf)
                if not k:
                    raise ConnectionError("calibration peer closed")
                got += k
            tcp_beta = max(time.perf_counter() - t - tcp_alpha, 1e-9) / _STREAM
            a.sendall(b"z")
        finally:
            a.close()
            m.close()
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return shm_alpha, tcp_alpha, tcp_beta


def _child_args() -> list[str]:
    return [str(_ROUNDS), str(_STREAM), str(_DEADLINE_S)]


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


# --- the round synchronisation of the direct shared-memory algorithms ----------------------

_SYNC_WARM = 20  # rounds before the timed ones (the wait policy learns the peers)
_SYNC_BATCH = 10  # rounds per timed batch (the estimate is the best batch)
_SYNC_BATCHES = 10
_SYNC_SLOT = 64  # payload bytes of each rank's slot (a barrier carries none)
#: bytes each rank copies between two barriers, as a direct algorithm's round does
#: (ranks that sleep while peers work must be woken and given a core again)
_SYNC_WORK = 256 << 10


def slot_sync() -> tuple[float, float]:
    """Seconds of one round synchronisation of the direct shared-memory algorithms: the
    slot barrier (:meth:`~.seqslot.SeqSlots.barrier`, what the native runtime's
    ``arena_sync`` runs) of 2 ranks on 2 cores, and of twice as many ranks as cores
    (4 ranks on 2 cores; 2 on 1 where only one core is usable), each a forked
    process confined to those cores. 0 for a point that could not be measured.

    Each round is a copy of :data:`_SYNC_WORK` bytes, then the barrier, as in a direct
    algorithm; the sync is the round less the copy (measured alone, times ranks per
    core: the copies of all ranks share the cores). Back-to-back barriers alone would
    miss what a sync costs when ranks outnumber cores: a rank that went to sleep while
    its peers worked must be woken and wait for a core (measured under load at 4 ranks
    on 2 cores: ~20 µs back to back, ~200-300 µs with 64-512 KiB copied between).

    Forked, not spawned: a fresh interpreter would import unison (hundreds of ms);
    a forked child runs only the round loop (no imports, no locks) and leaves with
    ``os._exit``. The best batch is the estimate, as for the other latencies."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 0.0, 0.0
    inside = _barrier_time(2, set(cpus[:2])) if len(cpus) >= 2 else 0.0
    few = cpus[: min(2, len(cpus))]
    crowded = _barrier_time(2 * len(few), set(few))
    return inside, crowded


def _barrier_time(p: int, cpus: set[int]) -> float:
    """Best seconds per barrier of ``p`` forked ranks confined to ``cpus``; 0 on failure."""
    if not hasattr(os, "fork"):
        return 0.0
    from .seqslot import SeqSlots, region_bytes

    nb = region_bytes(_SYNC_SLOT)
    shared = mmap.mmap(-1, p * nb + 8)  # anonymous and shared: the children inherit it
    view = memoryview(shared)
    regions = [view[q * nb : (q + 1) * nb] for q in range(p)]
    oversubscribed = p > len(cpus)
    timeout = _DEADLINE_S
    pids: list[int] = []
    try:
        for q in range(p):
            pid = os.fork()
            if pid == 0:  # the child: barriers only, then leave without cleanup
                code = 1
                try:
                    os.sched_setaffinity(0, cpus)
                    src = np.ones(_SYNC_WORK, np.uint8)
                    dst = np.zeros_like(src)
                    work = float("inf")
                    for _ in range(_SYNC_WARM):  # the copy alone (best: a core to itself)
                        t = time.perf_counter()
                        np.copyto(dst, src)
                        work = min(work, time.perf_counter() - t)
                    slots = SeqSlots(q, regions, _SYNC_SLOT, oversubscribed=oversubscribed)
                    for _ in range(_SYNC_WARM):
                        np.copyto(dst, src)
                        slots.barrier(timeout)
                    best = float("inf")
                    for _ in range(_SYNC_BATCHES):
                        t = time.perf_counter()
                        for _ in range(_SYNC_BATCH):
                            np.copyto(dst, src)
                            slots.barrier(timeout)
                        best = min(best, (time.perf_counter() - t) / _SYNC_BATCH)
                    if q == 0:
                        crowd = max(1.0, p / len(cpus))
                        struct.pack_into("d", shared, p * nb, max(best - crowd * work, 1e-7))
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        deadline = time.monotonic() + _DEADLINE_S
        ok = True
        while pids:  # reap only these children (others of this process are not ours)
            done, status = os.waitpid(pids[0], os.WNOHANG)
            if done:
                pids.pop(0)
                ok = ok and os.waitstatus_to_exitcode(status) == 0
            elif time.monotonic() > deadline:
                ok = False
                break
            else:
                time.sleep(0.002)
        return float(struct.unpack_from("d", shared, p * nb)[0]) if ok else 0.0
    except OSError:
        return 0.0
    finally:
        _end_children(pids)
        del regions
        view.release()
        shared.close()


def _end_children(pids: list[int]) -> None:
    """End the children still running past the deadline (only the ones started here)."""
    for pid in pids:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except OSError:
            pass


# --- the per-byte work of the slots and the direct algorithms, between processes ----------

#: calls per timed batch of :func:`shared_rates`; the estimate is the median batch (what
#: a run of calls typically takes: ``unison bench`` reports medians too), its pieces
#: each the best of :data:`_XFER_FORKS` pairs of processes
_XFER_BATCH = 4
#: batches per kind of call: as many as move about this many bytes per rank, 5 to 25
_XFER_BYTES = 96 << 20
#: pairs of processes :func:`shared_rates` measures in turn (a pair may run at half
#: speed throughout, e.g. in a virtual machine's slow spell: the best pair counts)
_XFER_FORKS = 3


def shared_rates(size: int = COPY) -> tuple[float, float, float]:
    """Seconds per byte of the slots' and the direct shared-memory algorithms' work as
    they do it: 2 ranks in separate processes on 2 cores calling
    :class:`~.seqslot.SeqSlots` all-gathers (each copies its half into its slot, a
    barrier, each copies both slots out: 1.5 copies per gathered byte) and all-reduces
    (each copies into its slot, a barrier, each reduces both slots into its buffer:
    a copy and a reduction per byte) of ``size`` and of ``size / 4`` bytes. Data
    written by one core and read by another while every core copies runs slower than
    in :func:`rates` (one process, its own cache): 1.5-3x on a 2-vCPU VM.

    Returns (copy, reduction, call): the copy and the reduction per byte of the
    ``size`` calls beyond ``call``, what a call costs whatever its bytes (the
    intercept of the two sizes' times: its barrier amid busy peers and its own Python
    work, kept between a bare barrier's time and half the small all-reduce's;
    :func:`cold_rates` prices bigger calls with it). Zeros where it could not be
    measured (fewer than 2 usable cores, no fork)."""
    got = _slot_times((size // 4, size))
    if got is None:
        return 0.0, 0.0, 0.0
    (bar, ag1, ar1), (_, ag2, ar2) = got
    span = size - size // 4
    copy = max(ag2 - ag1, 1e-9) / (1.5 * span)
    gamma = max(ar2 - ar1 - copy * span, 1e-9) / span
    # the intercept, kept between a bare barrier and half the small all-reduce (two
    # points a slow moment may have bent); the rates then follow from the big calls
    fixed = (ar2 - size * (copy + gamma) + ag2 - 1.5 * size * copy) / 2
    fixed = min(max(fixed, bar), ar1 / 2)
    copy = max(ag2 - fixed, 1e-9) / (1.5 * size)
    return copy, max(ar2 - fixed - copy * size, 1e-9) / size, fixed


def cold_rates(size: int, fixed: float) -> tuple[float, float]:
    """:func:`shared_rates`' copy and reduction for calls of ``size`` bytes alone (out of
    the cache when two ranks' slots and buffers outgrow it), less ``fixed`` seconds a
    call (:func:`shared_rates`' intercept). Zeros where it could not be measured."""
    got = _slot_times((size,))
    if got is None:
        return 0.0, 0.0
    _, ag, ar = got[0]
    copy = max(ag - fixed, 1e-9) / (1.5 * size)
    return copy, max(ar - fixed - copy * size, 1e-9) / size


def _slot_times(sizes: tuple[int, ...]) -> list[tuple[float, float, float]] | None:
    """Seconds of a bare barrier, an all-gather and an all-reduce of each of ``sizes``
    bytes (float32) on :class:`~.seqslot.SeqSlots`, 2 forked ranks confined to 2 cores:
    the median batch, best over :data:`_XFER_FORKS` pairs of fresh processes (a pair
    that failed, e.g. late or inconsistent on a busy host, is left out); None when every
    pair failed."""
    best: list[tuple[float, float, float]] | None = None
    for _ in range(_XFER_FORKS):
        got = _slot_times_once(sizes)
        if got is None:
            continue
        if best is not None:
            got = [
                (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]))
                for a, b in zip(best, got, strict=True)
            ]
        best = got
    return best


def _slot_times_once(sizes: tuple[int, ...]) -> list[tuple[float, float, float]] | None:
    try:
        cpus = set(sorted(os.sched_getaffinity(0))[:2])
    except (AttributeError, OSError):
        return None
    if len(cpus) < 2 or not hasattr(os, "fork"):
        return None
    from .seqslot import region_bytes

    p, most = 2, max(sizes)
    nb = (region_bytes(most) + _PAGE_BYTES - 1) // _PAGE_BYTES * _PAGE_BYTES
    out = p * nb  # the results: the barrier's, then two calls' per size (doubles)
    shared = mmap.mmap(-1, out + 8 * (1 + 2 * len(sizes)))  # shared: the children inherit it
    view = memoryview(shared)
    regions = [view[q * nb : (q + 1) * nb] for q in range(p)]
    pids: list[int] = []
    try:
        for q in range(p):
            pid = os.fork()
            if pid == 0:  # the child: calls only, then leave without cleanup
                code = 1
                try:
                    os.sched_setaffinity(0, cpus)
                    from .seqslot import SeqSlots

                    slots = SeqSlots(q, regions, most, oversubscribed=False)
                    best = _child_calls(slots, sizes)
                    if q == 0:
                        struct.pack_into(f"{len(best)}d", shared, out, *best)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        if not _reap(pids, time.monotonic() + _DEADLINE_S):
            return None
        bar, *calls = struct.unpack_from(f"{1 + 2 * len(sizes)}d", shared, out)
        got = [(bar, calls[2 * i], calls[2 * i + 1]) for i in range(len(sizes))]
        return got if all(0 < bar <= min(ag, ar) for _, ag, ar in got) else None
    except OSError:
        return None
    finally:
        _end_children(pids)
        del regions
        view.release()
        shared.close()


def _child_calls(slots: SeqSlots, sizes: tuple[int, ...]) -> list[float]:
    """One rank's median seconds (over batches) of a bare barrier, then per size of an
    all-gather (``size`` bytes gathered) and an all-reduce of ``size`` bytes on
    ``slots``; the kinds and sizes alternate batch by batch, so a slow moment hits all."""
    kinds: list[Callable[[], None]] = [lambda: slots.barrier(_DEADLINE_S)]
    for size in sizes:
        arr = np.zeros(size // 4, np.float32)  # zeros: the sums stay zero, call after call
        inp = np.ones(size // 8, np.float32)
        gathered = np.zeros(2 * inp.size, np.float32)
        kinds.append(functools.partial(slots.all_gather, inp, gathered, _DEADLINE_S))
        kinds.append(functools.partial(slots.all_reduce, arr, timeout=_DEADLINE_S))
    for body in kinds:  # warm: pages touched, the wait policy learnt
        for _ in range(_XFER_BATCH):
            body()
    times: list[list[float]] = [[] for _ in kinds]
    batches = max(5, min(25, _XFER_BYTES // max(1, sum(sizes) * _XFER_BATCH)))
    for _ in range(batches):
        for i, body in enumerate(kinds):
            # back to back, as an application's calls run: no barrier lines the ranks up
            t = time.perf_counter()
            for _ in range(_XFER_BATCH):
                body()
            times[i].append((time.perf_counter() - t) / _XFER_BATCH)
    return [sorted(ts)[len(ts) // 2] for ts in times]


def _reap(pids: list[int], deadline: float) -> bool:
    """Wait for these children (only them: others of this process are not ours) until
    ``deadline``; True when all exited cleanly. Reaped ones are removed from ``pids``."""
    ok = True
    while pids:
        done, status = os.waitpid(pids[0], os.WNOHANG)
        if done:
            pids.pop(0)
            ok = ok and os.waitstatus_to_exitcode(status) == 0
        elif time.monotonic() > deadline:
            return False
        else:
            time.sleep(0.002)
    return ok
