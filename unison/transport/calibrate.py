"""This machine's link model, measured: α and β per transport, per-message Python work.

The cost model that picks algorithms needs α (seconds per message), β (seconds
per byte) and the fixed Python cost of one call. Constants tuned on one
development VM are wrong on the next machine, so they are *measured* here, at
first use on a host, and cached per host under the user cache directory
(``$XDG_CACHE_HOME/unison`` or ``~/.cache/unison``; ``UNISON_LINK_CACHE``
overrides, ``off`` disables) in a file keyed by CPU model, usable cores and the
unison version. ``unison bench --calibrate`` re-measures. Each value can be
pinned with a knob (``UNISON_SHM_ALPHA``, ``UNISON_SHM_BETA``,
``UNISON_TCP_ALPHA``, ``UNISON_TCP_BETA``), which wins over the measurement;
``UNISON_CALL_OVERHEAD`` sets the model's per-call overhead (not measured here).

:func:`install` hands the model to :mod:`unison.link` (``set_measured``), the one
link model the selector, the algorithms' ``cost()`` and ``unison simulate`` read.
α there is one message's whole path: the measured hop plus the Python work of
both ends (``2 × overhead``).

What is measured (about a quarter of a second, once per host):

* shm α: half the round trip of a sequence number through a shared mapping
  between this process and a child process (the floor of a shared-memory hop);
* shm β: two local copies per byte (into the ring and out of it), plus one hop and
  the per-message Python work at both ends for every ring-full (a message crosses
  the ring in pieces of :data:`RING_PIECE` bytes);
* cma: one ``process_vm_readv`` copy per byte (the single-copy algorithms);
* the copy, reduction and cma rates twice: on 1 MiB arrays (in cache) and on arrays
  the size of the largest cache (out of cache); operations above a quarter of that
  size are priced with the second set (:meth:`unison.link.Link.at`);
* γ: one reduction per byte (``np.add`` of two float32 arrays into the first, the
  direct algorithms' arithmetic);
* tcp α and β: a round trip and an 8 MiB stream over a local socket pair;
* overhead: packing, parsing and matching one frame header in Python (the fixed
  per-message work of :mod:`.framing` at one end), the part no link removes.

Measurement happens under an exclusive lock on the cache file, so the ranks of a
job on one host measure once and all read the same numbers. Ranks on different
hosts may read different models; whoever selects algorithms from them must
agree on one (for instance rank 0's, broadcast at set-up).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import mmap
import os
import platform
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__

__all__ = [
    "Calibration",
    "LinkParams",
    "cache_path",
    "host_key",
    "install",
    "link",
    "load",
    "main",
    "measure",
]

_ROUNDS = 400  # ping-pong round trips per latency measurement
_BATCH = 50  # round trips per batch (the estimate is the best batch)
_DEADLINE_S = 5.0  # a measurement that takes longer is abandoned (defaults are used)
_LOCK_S = 60.0  # longest wait for another process's measurement
_STREAM = 8 << 20  # bytes streamed for the tcp bandwidth
_COPY = 1 << 20  # bytes per array for the in-cache copy, reduction and CMA rates
_COLD_MAX = 64 << 20  # largest array for the out-of-cache rates
_PIECE = 4 << 20  # bytes per copy or reduction call (a slot half)
_TRIES = 10  # passes per bandwidth measurement (the estimate is the best one)
#: bytes a message crosses the shm transport's ring in (the ring's capacity)
RING_PIECE = 1 << 19

# Used only when a measurement fails (no child process possible, deadline passed).
_FALLBACK_SHM = (5e-6, 2 / 4e9)
_FALLBACK_TCP = (25e-6, 1 / 1e9)
_FALLBACK_OVERHEAD = 10e-6

_KNOBS = {
    ("shm", "alpha"): "UNISON_SHM_ALPHA",
    ("shm", "beta"): "UNISON_SHM_BETA",
    ("tcp", "alpha"): "UNISON_TCP_ALPHA",
    ("tcp", "beta"): "UNISON_TCP_BETA",
}


@dataclass(frozen=True)
class LinkParams:
    """One transport's link: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float
    beta: float


@dataclass(frozen=True)
class Calibration:
    """A host's measured link model; ``source``: measured, cache, or knob overrides."""

    shm: LinkParams
    tcp: LinkParams
    overhead: float
    host: dict[str, Any]
    source: str = "measured"
    call_overhead: float = 0.0  # UNISON_CALL_OVERHEAD (seconds per call), not measured
    gamma: float = 0.0  # seconds per byte reduced (0: not measured)
    copy: float = 0.0  # seconds per byte of one local copy (0: not measured)
    cma: float = 0.0  # seconds per byte of process_vm_readv (0: not measured / unavailable)
    #: operations above this many bytes use the out-of-cache rates below (0: one regime)
    big: int = 0
    cold_gamma: float = 0.0
    cold_copy: float = 0.0
    cold_cma: float = 0.0

    def link(self, transport: str) -> LinkParams:
        return self.tcp if transport == "tcp" else self.shm

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("source")
        out.pop("call_overhead")
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str) -> Calibration:
        return cls(
            shm=LinkParams(float(data["shm"]["alpha"]), float(data["shm"]["beta"])),
            tcp=LinkParams(float(data["tcp"]["alpha"]), float(data["tcp"]["beta"])),
            overhead=float(data["overhead"]),
            host=dict(data["host"]),
            source=source,
            gamma=float(data["gamma"]),
            copy=float(data["copy"]),
            cma=float(data["cma"]),
            big=int(data["big"]),
            cold_gamma=float(data["cold_gamma"]),
            cold_copy=float(data["cold_copy"]),
            cold_cma=float(data["cold_cma"]),
        )


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return 0.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_key() -> dict[str, Any]:
    """What the cached model is valid for: CPU model, usable cores, unison version."""
    return {"cpu": _cpu_model(), "cores": _cores(), "unison": __version__}


def cache_path(env: Mapping[str, str] | None = None) -> Path | None:
    """This host's cache file, or None when caching is off (``UNISON_LINK_CACHE=off``)."""
    env = os.environ if env is None else env
    where = env.get("UNISON_LINK_CACHE", "").strip()
    if where.lower() == "off":
        return None
    if not where:
        base = env.get("XDG_CACHE_HOME", "").strip() or os.path.join(
            os.path.expanduser("~"), ".cache"
        )
        where = os.path.join(base, "unison")
    digest = hashlib.sha1(json.dumps(host_key(), sort_keys=True).encode()).hexdigest()[:16]
    return Path(where) / f"linkmodel-{digest}.json"


# --- measurements ---------------------------------------------------------------------------
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


def _cache_bytes() -> int:
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


def _rates(size: int) -> tuple[float, float, float]:
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


def _overhead() -> float:
    from .framing import OpSig, pack, unpack
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


def _pair() -> tuple[float, float, float]:
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


def measure() -> Calibration:
    """Measure this host now (no cache involved)."""
    overhead = _overhead()
    copy, gamma, cma_ = _rates(_COPY)
    # arrays this large no longer fit the last-level cache (at most 64 MiB each: the
    # measurement must not cost the rank that runs it more memory than that)
    cache = min(_cache_bytes(), _COLD_MAX)
    cold = _rates(cache)
    try:
        shm_alpha, tcp_alpha, tcp_beta = _pair()
        source = "measured"
    except (OSError, TimeoutError, ConnectionError):
        shm_alpha, (tcp_alpha, tcp_beta) = _FALLBACK_SHM[0], _FALLBACK_TCP
        source = "measured (pair test failed; defaults for α)"
    piece = (shm_alpha + 2 * overhead) / RING_PIECE  # a hop and both ends' work per piece
    return Calibration(
        shm=LinkParams(shm_alpha, 2 * copy + piece),
        tcp=LinkParams(tcp_alpha, tcp_beta),
        overhead=overhead,
        host={
            **host_key(),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load": _load(),
        },
        source=source,
        gamma=gamma,
        copy=copy,
        cma=cma_,
        big=cache // 4,  # a collective's working set (buffers, slots) is a few times n
        cold_copy=cold[0],
        cold_gamma=cold[1],
        cold_cma=cold[2],
    )


# --- cache and overrides --------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a") as lock:
        deadline = time.monotonic() + _LOCK_S
        while True:  # another rank of this host may be measuring: wait, with a deadline
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}.lock held for {_LOCK_S:g} s") from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> Calibration | None:
    try:
        data = json.loads(path.read_text())
        cal = Calibration.from_json(data, "cache")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    key = host_key()
    if not all(cal.host.get(k) == v for k, v in key.items()):
        return None
    then = float(cal.host.get("load", 0.0))
    if then > 0.5 * key["cores"] and _load() < then / 2:
        return None  # measured on a busy machine, which is quieter now: measure again
    return cal


def _write(path: Path, cal: Calibration) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cal.to_json(), indent=1, sort_keys=True))
    os.replace(tmp, path)


def _override(cal: Calibration, env: Mapping[str, str]) -> Calibration:
    from ..config import load_config

    cfg = load_config(env)
    links = {"shm": cal.shm, "tcp": cal.tcp}
    pinned = False
    for (tr, field), knob in _KNOBS.items():
        value = getattr(cfg, knob.removeprefix("UNISON_").lower())
        if value > 0:
            links[tr] = dataclasses.replace(links[tr], **{field: value})
            pinned = True
    pinned = pinned or cfg.call_overhead > 0
    source = cal.source + " + UNISON_* overrides" if pinned else cal.source
    return Calibration(
        links["shm"],
        links["tcp"],
        cal.overhead,
        cal.host,
        source,
        cfg.call_overhead,
        cal.gamma,
        cal.copy,
        cal.cma,
        cal.big,
        cal.cold_gamma,
        cal.cold_copy,
        cal.cold_cma,
    )


_memo: dict[str, Calibration] = {}


def load(
    env: Mapping[str, str] | None = None, *, remeasure: bool = False, measure_missing: bool = True
) -> Calibration:
    """This host's model: cached, else measured now (and cached); knobs applied.

    ``remeasure``: measure even when a cache exists (``unison bench --calibrate``).
    ``measure_missing=False``: return the fallback defaults instead of measuring.
    """
    env = os.environ if env is None else env
    path = cache_path(env)
    memo_key = str(path)
    cal = None if remeasure else _memo.get(memo_key)
    if cal is None:
        if path is None:
            cal = measure() if measure_missing else _fallback()
        else:
            with _locked(path):
                cal = None if remeasure else _read(path)
                if cal is None:
                    cal = measure() if measure_missing else _fallback()
                    if measure_missing:
                        _write(path, cal)
        _memo[memo_key] = cal
    return _override(cal, env)


def _fallback() -> Calibration:
    return Calibration(
        shm=LinkParams(*_FALLBACK_SHM),
        tcp=LinkParams(*_FALLBACK_TCP),
        overhead=_FALLBACK_OVERHEAD,
        host=host_key(),
        source="defaults (not measured)",
    )


def link(transport: str, env: Mapping[str, str] | None = None) -> LinkParams:
    """α and β of ``transport`` ("shm" or "tcp") on this host."""
    return load(env).link(transport)


def main(args: argparse.Namespace | None = None) -> int:
    """``unison bench --calibrate``: re-measure, write the cache, print the model."""
    cal = load(remeasure=True)
    path = cache_path()
    print(f"link model of {cal.host['cpu']} ({cal.host['cores']} cores), {cal.source}:")
    for tr in ("shm", "tcp"):
        p = cal.link(tr)
        print(f"  {tr}: alpha {p.alpha * 1e6:.2f} us, beta {1 / p.beta / 1e9:.2f} GB/s")
    print(f"  per-message Python work {cal.overhead * 1e6:.2f} us at each end")
    if cal.gamma > 0:
        print(f"  reduction {1 / cal.gamma / 1e9:.2f} GB/s (float32 add, one core)")
    if cal.copy > 0:
        print(f"  local copy {1 / cal.copy / 1e9:.2f} GB/s")
    if cal.cma > 0:
        print(f"  cross-memory copy {1 / cal.cma / 1e9:.2f} GB/s (process_vm_readv)")
    if cal.big > 0 and cal.cold_copy > 0:
        cold = [("copy", cal.cold_copy), ("reduction", cal.cold_gamma), ("cma", cal.cold_cma)]
        rates = ", ".join(f"{k} {1 / v / 1e9:.2f} GB/s" for k, v in cold if v > 0)
        print(f"  above {cal.big >> 20} MiB (out of cache): {rates}")
    print(f"cached in {path}" if path is not None else "not cached (UNISON_LINK_CACHE=off)")
    return 0


def install(env: Mapping[str, str] | None = None) -> Calibration | None:
    """Give this host's model to :mod:`unison.link`; call it where every rank shares the host.

    Ranks of one host read one cache file (measured once, under its lock), so they
    agree. With the cache off (``UNISON_LINK_CACHE=off``) nothing is measured per
    rank (that could disagree): only knobs apply, over the defaults. Returns what
    was installed, or None when nothing changed.
    """
    from .. import link as linkmodel

    env = os.environ if env is None else env
    try:
        cal = load(env, measure_missing=cache_path(env) is not None)
    except (OSError, TimeoutError) as exc:
        from ..log import get_logger

        get_logger("calibrate").debug("link model not measured (%s); using defaults", exc)
        return None
    if cal.source.startswith("defaults") and "overrides" not in cal.source:
        return None
    for tr in ("shm", "tcp"):
        p = cal.link(tr)
        base = linkmodel.DEFAULTS[tr]
        hot = dataclasses.replace(
            base,
            alpha=p.alpha + 2 * cal.overhead,
            hop=p.alpha,
            beta=p.beta,
            gamma=cal.gamma or base.gamma,
            copy=cal.copy if tr == "shm" else 0.0,
            cma=cal.cma if tr == "shm" else 0.0,
            overhead=cal.call_overhead or base.overhead,
        )
        if cal.big > 0 and cal.cold_copy > 0:
            shm = tr == "shm"
            # a shm message is two copies plus the per-piece work (already in p.beta)
            beta = p.beta + 2 * (cal.cold_copy - cal.copy) if shm else p.beta
            cold = dataclasses.replace(
                hot,
                beta=max(beta, p.beta),
                gamma=cal.cold_gamma or hot.gamma,
                copy=cal.cold_copy if shm else 0.0,
                cma=cal.cold_cma if shm else 0.0,
            )
            hot = dataclasses.replace(hot, big=cal.big, cold=cold)
        linkmodel.set_measured(tr, hot)
    return cal
