"""This machine's link model, measured: α and β per transport, per-message Python work.

The cost model that picks algorithms needs α (seconds per message), β (seconds
per byte) and the fixed Python cost of one call. Constants tuned on one
machine are wrong on the next, so they are *measured* here, by an explicit
command (``unison bench --calibrate``), and cached per host under the user cache
directory (``$XDG_CACHE_HOME/unison`` or ``~/.cache/unison``; ``UNISON_LINK_CACHE``
overrides, ``off`` disables) in a file keyed by CPU model, usable cores, the
unison version and the format of the figures (:data:`FORMAT`). A job's set-up never
measures: it reads the cache, and without one uses the figures of a typical commodity
x86 host (:func:`typical`), which pick the same algorithms as a measured host of that
kind. Each value can be
pinned with a knob (``UNISON_SHM_ALPHA``, ``UNISON_SHM_BETA``,
``UNISON_TCP_ALPHA``, ``UNISON_TCP_BETA``), which wins over the measurement;
``UNISON_CALL_OVERHEAD`` sets the model's per-call overhead (not measured here).

:func:`install` hands the model to :mod:`unison.link` (``set_measured``), the one
link model the selector, the algorithms' ``cost()`` and ``unison simulate`` read.
α there is one message's whole path: the measured hop plus the Python work of
both ends (``2 × overhead``).

What is measured (about a second, once per host):

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
* the copy and reduction rates *between processes*, as the slots and the direct
  shared-memory algorithms move data (:func:`.probe.shared_rates`): back-to-back
  all-gathers and all-reduces of 256 KiB and 1 MiB on the slots
  (:class:`~.seqslot.SeqSlots`) of two forked processes on two cores, the per-byte
  slopes, and what a call costs beyond them (its barrier amid busy peers); out of
  cache, calls of a quarter of the largest cache (:func:`.probe.cold_rates`). Data
  written by one core and read by another while every core works runs 1.5-3x slower
  than one process in its own cache. ``unison simulate`` predicts times with these
  (:meth:`unison.link.Link.between_processes`); the selector ranks algorithms with
  the one-process rates above;
* tcp α and β: a round trip and an 8 MiB stream over a local socket pair;
* overhead: packing, parsing and matching one frame header in Python (the fixed
  per-message work of :mod:`.framing` at one end), the part no link removes;
* the round synchronisation of the direct shared-memory algorithms: the slot
  barrier (:class:`~.seqslot.SeqSlots`, as the native runtime's arena sync runs it)
  of 2 ranks on 2 cores and of 4 ranks on 2 cores (forked processes confined to
  those cores; a few tens of ms), :attr:`unison.link.Link.sync` and
  :attr:`~unison.link.Link.sync_crowded`. ``UNISON_SHM_SYNC`` and
  ``UNISON_SHM_SYNC_CROWDED`` pin them.

Measurement happens under an exclusive lock on the cache file and the cache is
replaced atomically, so the ranks of a job on one host read the same numbers;
whoever selects algorithms from them still checks that they agree
(:meth:`Calibration.digest`), since a calibration may land between two ranks' reads.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..jobenv import host_cores
from . import probe

__all__ = [
    "FORMAT",
    "Calibration",
    "LinkParams",
    "cache_path",
    "host_key",
    "install",
    "link",
    "load",
    "main",
    "measure",
    "typical",
]

_LOCK_S = 60.0  # longest wait for another process's measurement
#: bytes a message crosses the shm transport's ring in (the ring's capacity)
RING_PIECE = 1 << 19

# α of the links when the pair test of a measurement fails (no child process possible,
# deadline passed)
_FALLBACK_SHM = (5e-6, 2 / 4e9)
_FALLBACK_TCP = (25e-6, 1 / 1e9)

_KNOBS = {
    ("shm", "alpha"): "UNISON_SHM_ALPHA",
    ("shm", "beta"): "UNISON_SHM_BETA",
    ("tcp", "alpha"): "UNISON_TCP_ALPHA",
    ("tcp", "beta"): "UNISON_TCP_BETA",
}
_SYNC_KNOBS = {"sync": "UNISON_SHM_SYNC", "sync_crowded": "UNISON_SHM_SYNC_CROWDED"}


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
    #: seconds of one slot barrier (the direct algorithms' round sync): 2 ranks on 2
    #: cores, and 2 ranks per core (0: not measured)
    sync: float = 0.0
    sync_crowded: float = 0.0
    #: the copy and reduction rates between processes (:func:`.probe.shared_rates`), in
    #: and out of cache, and the slot call's cost beyond them less one end's Python
    #: work (0: not measured)
    xcopy: float = 0.0
    xgamma: float = 0.0
    cold_xcopy: float = 0.0
    cold_xgamma: float = 0.0
    xsync: float = 0.0

    def link(self, transport: str) -> LinkParams:
        return self.tcp if transport == "tcp" else self.shm

    def digest(self) -> str:
        """A short fingerprint of the model's figures (not where they came from): ranks
        that select algorithms from it compare fingerprints before using it."""
        data = self.to_json()
        data.pop("host", None)
        text = json.dumps(data, sort_keys=True) + f"|{self.call_overhead!r}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

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
            sync=float(data["sync"]),
            sync_crowded=float(data["sync_crowded"]),
            xcopy=float(data["xcopy"]),
            xgamma=float(data["xgamma"]),
            cold_xcopy=float(data["cold_xcopy"]),
            cold_xgamma=float(data["cold_xgamma"]),
            xsync=float(data["xsync"]),
        )


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return 0.0


@functools.cache  # the processor does not change while a process runs
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: what the cached figures are (bumped when fields are added or change meaning: a cache
#: of another format lives under another file name and is never read)
FORMAT = 2


def host_key() -> dict[str, Any]:
    """What the cached model is valid for: CPU model, usable cores, unison version and
    the :data:`FORMAT` of the figures."""
    return {"cpu": _cpu_model(), "cores": host_cores(), "unison": __version__, "format": FORMAT}


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


def measure() -> Calibration:
    """Measure this host now (no cache involved)."""
    overhead = probe.per_message_overhead()
    copy, gamma, cma_ = probe.rates(probe.COPY)
    # arrays this large no longer fit the last-level cache (at most 64 MiB each: the
    # measurement must not cost the rank that runs it more memory than that)
    cache = min(probe.cache_bytes(), probe.COLD_MAX)
    cold = probe.rates(cache)
    try:
        shm_alpha, tcp_alpha, tcp_beta = probe.pair()
        source = "measured"
    except (OSError, TimeoutError, ConnectionError):
        shm_alpha, (tcp_alpha, tcp_beta) = _FALLBACK_SHM[0], _FALLBACK_TCP
        source = "measured (pair test failed; defaults for α)"
    sync, sync_crowded = probe.slot_sync()
    xcopy, xgamma, xcall = probe.shared_rates(probe.COPY)
    cold_x = probe.cold_rates(cache // 4, xcall) if xcopy > 0 else (0.0, 0.0)
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
        sync=sync,
        sync_crowded=sync_crowded,
        xcopy=xcopy,
        xgamma=xgamma,
        cold_xcopy=cold_x[0],
        cold_xgamma=cold_x[1],
        # the call's cost beyond its bytes, less its own Python work (the model adds
        # one end's per-message work to every round), at least a quarter of it
        xsync=max(xcall - overhead, xcall / 4),
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


def _read(path: Path, strict: bool = True) -> Calibration | None:
    """The cached model of this host, or None. ``strict``: also None when it was
    measured on a busy machine that is quieter now (worth measuring again); a reader
    that will not measure takes it anyway (a busy host's figures beat no figures)."""
    try:
        data = json.loads(path.read_text())
        cal = Calibration.from_json(data, "cache")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    key = host_key()
    if not all(cal.host.get(k) == v for k, v in key.items()):
        return None
    then = float(cal.host.get("load", 0.0))
    if strict and then > 0.5 * key["cores"] and _load() < then / 2:
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
    syncs = {}
    for field, knob in _SYNC_KNOBS.items():
        value = getattr(cfg, knob.removeprefix("UNISON_").lower())
        syncs[field] = value if value > 0 else getattr(cal, field)
        pinned = pinned or value > 0
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
        **syncs,
        xcopy=cal.xcopy,
        xgamma=cal.xgamma,
        cold_xcopy=cal.cold_xcopy,
        cold_xgamma=cal.cold_xgamma,
        xsync=cal.xsync,
    )


_memo: dict[str, Calibration] = {}


def load(
    env: Mapping[str, str] | None = None, *, remeasure: bool = False, measure_missing: bool = False
) -> Calibration:
    """This host's model: cached, else :func:`typical` (or measured now and cached, with
    ``measure_missing``); knobs applied.

    ``remeasure``: measure even when a cache exists (``unison bench --calibrate``).
    Only explicit commands measure: a job's set-up reads what is cached.
    """
    env = os.environ if env is None else env
    path = cache_path(env)
    memo_key = str(path)
    cal = None if remeasure else _memo.get(memo_key)
    if cal is None:
        if path is None:
            cal = measure() if measure_missing or remeasure else None
        elif not (measure_missing or remeasure):
            cal = _read(path, strict=False)  # replaced atomically: no lock to read it
        else:
            with _locked(path):
                cal = None if remeasure else _read(path)
                if cal is None:
                    cal = measure()
                    _write(path, cal)
        if cal is None:
            return typical(env)  # not remembered: a calibration may follow
        _memo[memo_key] = cal
    return _override(cal, env)


def typical(env: Mapping[str, str] | None = None) -> Calibration:
    """The figures of a typical commodity x86 host (a few-core server or VM: ~0.5 µs
    shared-memory hop, ~20 GB/s copies and reductions in cache, ~6 GB/s out of it), used where this
    host was never calibrated. They are a prior, not a measurement: they make the
    selector pick the algorithms a measured host of that kind picks (direct
    shared-memory rounds for small and medium operations, single-copy reads where
    cross-memory attach works, which the algorithms check at run time). Knobs
    (``env``, default the environment) apply over them."""
    cal = Calibration(
        shm=LinkParams(1e-6, 1 / 8e9),
        tcp=LinkParams(15e-6, 1 / 1.5e9),
        overhead=6e-6,
        host=host_key(),
        source="defaults (not measured)",
        gamma=1 / 20e9,
        copy=1 / 20e9,
        cma=1 / 2e9,
        big=8 << 20,
        cold_gamma=1 / 8e9,
        cold_copy=1 / 6e9,
        cold_cma=1 / 6e9,
        sync=20e-6,
        sync_crowded=200e-6,
    )
    return _override(cal, os.environ if env is None else env)


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
    if cal.sync > 0:
        crowded = f", 2 ranks per core {cal.sync_crowded * 1e6:.1f} us" if cal.sync_crowded else ""
        print(f"  round sync (slot barrier) {cal.sync * 1e6:.1f} us{crowded}")
    if cal.xcopy > 0:
        print(
            f"  between processes: copy {1 / cal.xcopy / 1e9:.2f} GB/s, reduction "
            f"{1 / cal.xgamma / 1e9:.2f} GB/s, call beyond them {cal.xsync * 1e6:.1f} us"
        )
    if cal.cold_xcopy > 0:
        print(
            f"  between processes out of cache: copy {1 / cal.cold_xcopy / 1e9:.2f} GB/s, "
            f"reduction {1 / cal.cold_xgamma / 1e9:.2f} GB/s"
        )
    print(f"cached in {path}" if path is not None else "not cached (UNISON_LINK_CACHE=off)")
    return 0


def install(env: Mapping[str, str] | None = None, cal: Calibration | None = None) -> Calibration:
    """Give this host's model (``cal``, default :func:`load`'s: the cache, else
    :func:`typical`) to :mod:`unison.link`; call it where every rank shares the host.
    Never measures. Returns what was installed."""
    from .. import link as linkmodel

    if cal is None:
        cal = load(env)
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
            sync=cal.sync if tr == "shm" else 0.0,
            sync_crowded=cal.sync_crowded if tr == "shm" else 0.0,
            xcopy=cal.xcopy if tr == "shm" else 0.0,
            xgamma=cal.xgamma if tr == "shm" else 0.0,
            xsync=cal.xsync if tr == "shm" else 0.0,
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
                xcopy=cal.cold_xcopy if shm else 0.0,
                xgamma=cal.cold_xgamma if shm else 0.0,
            )
            hot = dataclasses.replace(hot, big=cal.big, cold=cold)
        linkmodel.set_measured(tr, hot)
    return cal
