"""The raw measurements behind :mod:`.calibrate`'s link model.

Each function measures one thing on this host, now, and returns seconds (per message
or per byte); :func:`unison.transport.calibrate.measure` assembles them into a
:class:`~unison.transport.calibrate.Calibration`. Kept apart from the cache, lock and
override logic so that each file does one job.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

__all__ = ["COLD_MAX", "COPY", "cache_bytes", "pair", "per_message_overhead", "rates", "slot_sync"]

_ROUNDS = 400  # ping-pong round trips per latency measurement
_BATCH = 50  # round trips per batch (the estimate is the best batch)
_DEADLINE_S = 5.0  # a measurement that takes longer is abandoned (defaults are used)
_STREAM = 8 << 20  # bytes streamed for the tcp bandwidth
COPY = 1 << 20  # bytes per array for the in-cache copy, reduction and CMA rates
COLD_MAX = 64 << 20  # largest array for the out-of-cache rates
_PIECE = 4 << 20  # bytes per copy or reduction call (a slot half)
_TRIES = 10  # passes per bandwidth measurement (the estimate is the best one)

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
        for pid in pids:  # a child past the deadline: end it (only the ones started here)
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
        del regions
        view.release()
        shared.close()
