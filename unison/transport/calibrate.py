"""This machine's link model, measured: α and β per transport, per-message Python work.

The cost model that picks algorithms needs α (seconds per message), β (seconds
per byte) and the fixed Python cost of one call. Constants tuned on one
machine are wrong on the next, so they are *measured* here, at
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
  per-message work of :mod:`.framing` at one end), the part no link removes;
* the round synchronisation of the direct shared-memory algorithms: the slot
  barrier (:class:`~.seqslot.SeqSlots`, as the native runtime's arena sync runs it)
  of 2 ranks on 2 cores and of 4 ranks on 2 cores (forked processes confined to
  those cores; a few tens of ms), :attr:`unison.link.Link.sync` and
  :attr:`~unison.link.Link.sync_crowded`. ``UNISON_SHM_SYNC`` and
  ``UNISON_SHM_SYNC_CROWDED`` pin them.

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
import os
import platform
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..jobenv import usable_cores
from . import probe

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

_LOCK_S = 60.0  # longest wait for another process's measurement
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
            sync=float(data["sync"]),
            sync_crowded=float(data["sync_crowded"]),
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


def host_key() -> dict[str, Any]:
    """What the cached model is valid for: CPU model, usable cores, unison version."""
    return {"cpu": _cpu_model(), "cores": usable_cores(), "unison": __version__}


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
    if cal.sync > 0:
        crowded = f", 2 ranks per core {cal.sync_crowded * 1e6:.1f} us" if cal.sync_crowded else ""
        print(f"  round sync (slot barrier) {cal.sync * 1e6:.1f} us{crowded}")
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
            sync=cal.sync if tr == "shm" else 0.0,
            sync_crowded=cal.sync_crowded if tr == "shm" else 0.0,
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
