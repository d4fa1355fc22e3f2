"""The one link model: what the selector, every algorithm's ``cost()`` and
``unison simulate`` evaluate.

A :class:`Link` is α (seconds per message), β (seconds per byte moved), γ (seconds
per byte reduced) and a per-call overhead (seconds every operation pays once,
whatever the algorithm: the Python path from the API to the first send). Two
refinements: :class:`SharedLink` (every rank on one host, so the direct
shared-memory algorithms apply) and :class:`TwoLevelLink` (several hosts:
inter-host α/β plus the intra-host link and the host layout).

Layer: this module sits at the bottom of unison (it imports nothing of unison),
so transports, algorithms, backends and tools may all read it.

Measured values: :data:`DEFAULTS` holds typical figures of a commodity x86 host,
used until a host is calibrated. A calibration module supplies its own with :func:`set_measured`
(``set_measured("shm", Link(alpha=..., beta=...))``) before ``unison.init()``;
:func:`transport_link` then answers with them. Every rank must supply the same
values (the choice of algorithm must agree), e.g. from a file the launcher
shares, never from a per-rank timing.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field, replace

__all__ = [
    "DEFAULTS",
    "SLOT_BYTES",
    "Link",
    "SharedLink",
    "TwoLevelLink",
    "clear_measured",
    "crowding",
    "log2ceil",
    "measured",
    "set_measured",
    "shared_link",
    "sync_at",
    "transport_link",
    "two_level",
    "wake",
]

#: bytes of each rank's shared-memory slot (two halves alternate between rounds)
SLOT_BYTES = 8 << 20


@dataclass(frozen=True)
class Link:
    """α: seconds per message; β: seconds per byte moved; γ: seconds per byte reduced;
    ``overhead``: seconds per call, paid once whatever the algorithm."""

    alpha: float = 40e-6
    beta: float = 1 / 1.5e9
    gamma: float = 1 / 4e9
    overhead: float = 0.0
    #: seconds of the bare signal between two ranks (α without the per-message Python
    #: work); 0: not known
    hop: float = 0.0
    #: seconds per byte of one local memory copy (0: not known)
    copy: float = 0.0
    #: seconds per byte copied out of another process by cross-memory attach
    #: (``process_vm_readv``); 0: not known (the algorithms that use it are not chosen)
    cma: float = 0.0
    #: operations on more bytes than this use :attr:`cold` (0: one regime)
    big: int = 0
    #: the same link with the per-byte rates of data that no longer fits the caches
    #: (None: one regime; see :meth:`at`)
    cold: Link | None = None
    #: seconds of one round synchronisation of the direct shared-memory algorithms
    #: with ranks no more than cores (measured: the slot barrier of 2 ranks on 2 cores;
    #: 0: not known, see :func:`shared_link`)
    sync: float = 0.0
    #: the same with two ranks per core (measured: 4 ranks on 2 cores), where every
    #: sync waits for ranks that must first be given a core; 0: not known
    #: (:func:`sync_at` then scales :attr:`sync` by ranks per core)
    sync_crowded: float = 0.0
    #: seconds per byte of a copy and of a reduction between processes, every core at
    #: work (data one core wrote, another reads: how the slots and the direct
    #: algorithms move it), and of a round sync amid busy peers; 0: not measured
    #: (see :meth:`between_processes`)
    xcopy: float = 0.0
    xgamma: float = 0.0
    xsync: float = 0.0

    def between_processes(self) -> Link:
        """The same link at the rates measured between processes (:attr:`xcopy`,
        :attr:`xgamma`, :attr:`xsync`; the out-of-cache link's too), where measured:
        what ``unison simulate`` predicts times with. A message's two copies (β) take
        the cross-process copy rate as well. The selector ranks algorithms on the link
        itself (one process's in-cache rates)."""
        cold = self.cold.between_processes() if self.cold is not None else None
        link = replace(self, cold=cold)
        if self.xcopy > 0 and self.xgamma > 0:
            beta = self.beta + 2 * (self.xcopy - self.copy) if self.copy > 0 else self.beta
            link = replace(link, copy=self.xcopy, gamma=self.xgamma, beta=max(beta, self.beta))
        return replace(link, sync=self.xsync) if self.xsync > 0 and self.sync > 0 else link

    def at(self, n: int, p: int = 0) -> Link:
        """The link for an operation on ``n`` bytes: per-byte costs measured in cache
        for small operations, out of cache (:attr:`cold`) above :attr:`big`; with ``p``
        ranks, α includes the wake-up a message step costs when ranks outnumber cores
        (:func:`wake`), as every slot sync does (:func:`sync_at`)."""
        cold = self.cold
        link = cold if cold is not None and 0 < self.big < n else self
        extra = wake(p, link) if p > 1 else 0.0
        return replace(link, alpha=link.alpha + extra) if extra > 0 else link


@dataclass(frozen=True)
class SharedLink(Link):
    """Every rank of the job on one host: the direct shared-memory algorithms apply.

    ``copy``: seconds per byte of one local memory copy (the direct algorithms' data
    movement, as opposed to ``beta``, a message through a transport); ``half``: bytes
    of one half of a rank's slot (one round of a direct algorithm moves at most that).
    """

    copy: float = 1 / 8e9
    half: int = SLOT_BYTES // 2
    #: cores of the host (0: not known); when ranks outnumber them, the direct
    #: algorithms' per-byte work of all ranks shares them
    cores: int = 0
    #: bytes of working set that still run at the in-cache rates (the calibration's
    #: :attr:`Link.big`, kept on the out-of-cache link too; 0: not known): the direct
    #: algorithms keep a round's slots and chunk within it (:mod:`unison.algorithms.shm_arena`)
    warm: int = 0
    #: on that out-of-cache link, the in-cache copy and reduction rates (s/byte), which
    #: a round that fits :attr:`warm` runs at (0: not known)
    warm_copy: float = 0.0
    warm_gamma: float = 0.0


@dataclass(frozen=True)
class TwoLevelLink(Link):
    """A job over several hosts: ``alpha``/``beta`` are the inter-host (slowest) link, as
    every flat algorithm assumes; ``intra`` is the link between ranks of one host.

    ``hosts`` × ``per_host`` ranks, contiguous by host (``per_host`` 0: hosts hold
    different numbers of ranks). Hierarchical algorithms use both levels.
    """

    intra: Link = field(default_factory=Link)
    hosts: int = 1
    per_host: int = 0


#: per transport: typical figures of a commodity x86 host, until `unison bench --calibrate`
DEFAULTS: dict[str, Link] = {
    # tcp: one framed message through a socket, both ends
    "tcp": Link(alpha=40e-6, beta=1 / 1.5e9),
    # shm: one message's Python path through a ring (a ring hop is ~1 µs of it);
    # two copies (into and out of the ring) plus framing, pipelined
    "shm": Link(alpha=15e-6, beta=1 / 3e9, hop=1e-6),
}

_measured: dict[str, Link] = {}
_lock = threading.Lock()


def set_measured(transport: str, link: Link) -> None:
    """Use ``link`` for ``transport`` (``"tcp"``, ``"shm"``) from now on in this process
    (a calibration module's entry point). Takes effect for jobs initialised later."""
    if transport not in DEFAULTS:
        raise ValueError(f"unknown transport {transport!r}; known: {', '.join(DEFAULTS)}")
    with _lock:
        _measured[transport] = link


def clear_measured() -> None:
    """Forget every measured link (back to :data:`DEFAULTS`)."""
    with _lock:
        _measured.clear()


def measured() -> dict[str, Link]:
    """The links a calibration supplied, by transport."""
    with _lock:
        return dict(_measured)


def transport_link(transport: str) -> Link:
    """The link of one transport: measured if a calibration supplied one, else default."""
    with _lock:
        got = _measured.get(transport)
    return got if got is not None else DEFAULTS[transport]


def shared_link(
    base: Link | None = None, half: int = SLOT_BYTES // 2, slots: bool = False
) -> SharedLink:
    """The link of a job whose ranks all share one host (``base``: the shm link);
    ``slots``: rounds synchronise on the shared sequence slots (no message).

    The local copy cost is the measured one (else half the shm β: a message through
    shared memory is two copies); the round synchronisation on the slots is the
    measured slot barrier (``base.sync``, ``base.sync_crowded``), else α (a hop plus
    the Python work of both ends); without slots ``sync`` is 0 (zero-byte messages,
    priced by α per message); ``cores`` is the host's CPU count (the same for every
    rank of the host, whatever its affinity)."""
    b = transport_link("shm") if base is None else base
    cold = shared_link(b.cold, half, slots) if b.cold is not None else None
    if cold is not None:
        cold = replace(cold, warm=b.big, warm_copy=b.copy or b.beta / 2, warm_gamma=b.gamma)
    return SharedLink(
        b.alpha,
        b.beta,
        b.gamma,
        b.overhead,
        b.hop,
        copy=b.copy or b.beta / 2,
        cma=b.cma,
        big=b.big if cold is not None else 0,
        cold=cold,
        half=half,
        sync=(b.sync or b.alpha) if slots else 0.0,
        sync_crowded=b.sync_crowded if slots else 0.0,
        cores=os.cpu_count() or 0,
    )


def two_level(host_of: dict[int, str], inter: Link, transport: str) -> TwoLevelLink | None:
    """The two-level link of a job over several hosts (None on one host).

    It depends only on the host layout (rank → host identity, learnt alike by every
    rank) and on configuration (``transport``: ``"tcp"`` forces TCP within a host too),
    so every rank computes the same one.
    """
    counts: dict[str, int] = {}
    for r in sorted(host_of):
        counts[host_of[r]] = counts.get(host_of[r], 0) + 1
    if len(counts) < 2:
        return None
    seen: set[str] = set()
    contiguous, prev = True, None
    for r in sorted(host_of):
        h = host_of[r]
        if h != prev:
            contiguous = contiguous and h not in seen
            seen.add(h)
            prev = h
    sizes = set(counts.values())
    per_host = sizes.pop() if len(sizes) == 1 and contiguous else 0
    intra = transport_link("shm") if transport != "tcp" else inter
    intra = replace(intra, gamma=inter.gamma)
    return TwoLevelLink(
        inter.alpha,
        inter.beta,
        inter.gamma,
        inter.overhead,
        inter.hop,
        intra=intra,
        hosts=len(counts),
        per_host=per_host,
    )


def crowding(p: int, link: Link) -> float:
    """Ranks per core (≥ 1) on a one-host link: when ``p`` ranks outnumber the host's
    cores, the per-byte work of all of them (copies, reductions) queues for the same
    cores, so each rank's share takes ``p / cores`` times as long."""
    cores = link.cores if isinstance(link, SharedLink) else 0
    return max(1.0, p / cores) if cores > 0 else 1.0


def sync_at(p: int, link: Link) -> float:
    """Seconds of one round synchronisation of ``p`` ranks on the shared slots (0: the
    link has none, see :attr:`Link.sync`).

    With ranks no more than cores it is :attr:`Link.sync`. Beyond that, a sync waits
    for ranks that must first get a core (a wake-up each): linear in ranks per core
    ``r`` through the two measured points, ``sync`` at r = 1 and
    :attr:`Link.sync_crowded` at r = 2; with only ``sync`` known, ``sync × r``."""
    if link.sync <= 0:
        return 0.0
    r = crowding(p, link)
    if r <= 1:
        return link.sync
    if link.sync_crowded > 0:
        return link.sync + max(0.0, link.sync_crowded - link.sync) * (r - 1)
    return link.sync * r


def wake(p: int, link: Link) -> float:
    """Seconds a step that waits for a peer costs beyond its uncrowded price when ``p``
    ranks outnumber the host's cores: the measured crowded sync less the uncrowded one
    (a message step waits for a peer that must be woken and given a core, as a slot
    sync does). 0 with a core per rank or no measured sync."""
    return max(0.0, sync_at(p, link) - link.sync) if link.sync > 0 else 0.0


def log2ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0
