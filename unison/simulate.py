"""``unison simulate``: predict all-reduce times from the α-β-γ cost model.

The predictions are the selector's own: each algorithm's ``cost(p, n, link)`` from
:mod:`unison.algorithms`, evaluated on a :class:`~unison.link.Link` (one
host) or :class:`~unison.link.TwoLevelLink` (``--hosts`` > 1: α/β of the
network between hosts, ``--intra`` between the ranks of one host). Algorithms:

* ``ring``: flat ring (reduce-scatter + all-gather), :mod:`.all_reduce_ring`;
* ``rd``: recursive doubling, :mod:`.all_reduce_recursive_doubling`;
* ``tree``: binomial reduce to rank 0 then binomial broadcast (the selector's
  ``reduce`` and ``broadcast`` costs added);
* ``hierarchical``: intra-host reduce-scatter, inter-host all-reduce per slice,
  intra-host all-gather, :mod:`.all_reduce_hierarchical` (needs ``--hosts`` ≥ 2);
* ``shm``: the direct shared-memory algorithm (``--link shm`` only);
* ``shm1``: its one-phase variant, :mod:`.all_reduce_shm_one` (``--link shm`` only).

Bus bandwidth follows nccl-tests: algbw = n / t, busbw = algbw · 2(p−1)/p.
``--link shm`` uses the link the native runtime uses on one host — this host's
measured model (:mod:`unison.transport.calibrate`, cached per host), synchronising
rounds on the shared slots — which is how ``--validate bench.json`` compares the
model with what ``unison bench`` measured on the same host. ``--gamma`` overrides
the measured reduction speed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .algorithms import (
    all_reduce_hierarchical,
    all_reduce_recursive_doubling,
    all_reduce_ring,
    all_reduce_shm,
    all_reduce_shm_one,
    broadcast_binomial,
    reduce_binomial,
    slot_path,
)
from .algorithms.select import choose
from .config import load_config
from .errors import InvalidArgumentError
from .link import Link, TwoLevelLink, shared_link

__all__ = [
    "ALGOS",
    "VALIDATED",
    "Prediction",
    "build_link",
    "configure_parser",
    "main",
    "parse_bandwidth",
    "parse_latency",
    "parse_size",
    "predict",
    "hosts_links",
    "price",
    "shm_links",
]

Cost = Callable[[int, int, Link], float]


def _tree(p: int, n: int, link: Link) -> float:
    return reduce_binomial.cost(p, n, link) + broadcast_binomial.cost(p, n, link)


#: name -> (cost function, the selector's name for it or "" when not an all-reduce choice)
ALGOS: dict[str, tuple[Cost, str]] = {
    "ring": (all_reduce_ring.cost, all_reduce_ring.NAME),
    "tree": (_tree, ""),
    "rd": (all_reduce_recursive_doubling.cost, all_reduce_recursive_doubling.NAME),
    "hierarchical": (all_reduce_hierarchical.cost, all_reduce_hierarchical.NAME),
    "shm": (all_reduce_shm.cost, all_reduce_shm.NAME),
    "shm1": (all_reduce_shm_one.cost, all_reduce_shm_one.NAME),
}

_SIZE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_size(text: str) -> int:
    """``1G`` → 2**30 bytes (K, M, G, T binary; an optional trailing B or iB)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtKMGT]?)(i?[bB])?\s*", text)
    if not m:
        raise InvalidArgumentError(f"size {text!r}: expected e.g. 1024, 64K, 1G")
    return int(float(m.group(1)) * _SIZE[m.group(2).lower()])


def parse_bandwidth(text: str) -> float:
    """Bytes per second: ``100Gbit`` (bits, decimal), ``300GB/s`` (bytes, decimal)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtKMGT]?)(bit|b|B|Bps|bps)?(/s)?\s*", text)
    if not m:
        raise InvalidArgumentError(f"bandwidth {text!r}: expected e.g. 100Gbit or 300GB/s")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    unit = m.group(3) or "B"
    bits = unit in ("bit", "b", "bps")
    value = float(m.group(1)) * scale / (8 if bits else 1)
    if value <= 0:
        raise InvalidArgumentError(f"bandwidth {text!r} must be positive")
    return value


def parse_latency(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ns|us|µs|ms|s)\s*", text)
    if not m:
        raise InvalidArgumentError(f"latency {text!r}: expected e.g. 5us, 1.5ms")
    return float(m.group(1)) * _TIME[m.group(2)]


def shm_links(gamma: float | None = None) -> tuple[Link, Link]:
    """This host's measured one-host link twice: as the runtime's selector ranks
    algorithms on it (one process's in-cache rates), and as predictions price them
    (the rates measured between processes, :meth:`~unison.link.Link.between_processes`).
    ``gamma``: a reduction speed to use in both instead of the measured ones."""
    from .link import transport_link
    from .transport import calibrate

    calibrate.install()  # this host's model (cached per host), as init() reads it
    base = transport_link("shm")
    pick, price_ = shared_link(base, slots=True), shared_link(base.between_processes(), slots=True)
    if gamma:
        return replace(pick, gamma=gamma), replace(price_, gamma=gamma)
    return pick, price_


def _link(spec: str, gamma: float | None) -> Link:
    """``BANDWIDTH,LATENCY`` (either order) → Link; ``shm``: this host's measured one-host
    link as predictions price it (:func:`shm_links`). ``gamma`` None: the measured (or
    default) one."""
    if spec == "shm":
        return shm_links(gamma)[1]
    gamma = gamma or Link().gamma
    parts = [s.strip() for s in spec.split(",")]
    if len(parts) != 2:
        raise InvalidArgumentError(f"link {spec!r}: expected BANDWIDTH,LATENCY e.g. 100Gbit,5us")
    lat = [p for p in parts if re.search(r"\d\s*(ns|us|µs|ms|s)$", p)]
    if len(lat) != 1:
        raise InvalidArgumentError(f"link {spec!r}: one part must be a latency (5us)")
    bw = parts[1 - parts.index(lat[0])]
    return Link(parse_latency(lat[0]), 1 / parse_bandwidth(bw), gamma)


def build_link(np_: int, hosts: int, link: str, intra: str, gamma: float | None) -> Link:
    """The link the selector would see for ``np_`` ranks on ``hosts`` hosts."""
    if hosts < 1 or np_ < 1:
        raise InvalidArgumentError("--np and --hosts must be >= 1")
    if hosts == 1:
        return _link(intra or link, gamma)
    if np_ % hosts:
        raise InvalidArgumentError(f"--np {np_} is not a multiple of --hosts {hosts}")
    inter = _link(link, gamma)
    inner = _link(intra, gamma) if intra else inter
    return TwoLevelLink(
        inter.alpha, inter.beta, inter.gamma, intra=inner, hosts=hosts, per_host=np_ // hosts
    )


@dataclass(frozen=True)
class Prediction:
    algo: str
    p: int
    nbytes: int
    seconds: float

    @property
    def algbw(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else math.inf

    @property
    def busbw(self) -> float:
        return self.algbw * 2 * (self.p - 1) / self.p if self.p > 1 else 0.0


def predict(algo: str, p: int, n: int, link: Link) -> Prediction:
    if algo not in ALGOS:
        raise InvalidArgumentError(f"--algo {algo!r}: known {', '.join(ALGOS)}")
    return Prediction(algo, p, n, ALGOS[algo][0](p, n, link.at(n, p)))


def selected(p: int, n: int, link: Link) -> str:
    """The algorithm unison's selector would run for this all-reduce."""
    name = choose("all_reduce", p, n, link, {}).name
    return next((k for k, (_, sel) in ALGOS.items() if sel == name), name)


def _fmt_t(s: float) -> str:
    if not math.isfinite(s):
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fmt_bw(b: float) -> str:
    return f"{b / 1e9:.2f}" if math.isfinite(b) else "-"


def _sizes(text: str) -> list[int]:
    if ":" in text:
        lo, hi = (parse_size(x) for x in text.split(":", 1))
        out = []
        n = lo
        while n <= hi:
            out.append(n)
            n *= 4
        return out
    return [parse_size(x) for x in text.split(",")]


def table(
    p: int, hosts: int, sizes: list[int], algos: list[str], link: Link, pick: Link | None = None
) -> str:
    """Predicted time and bus bandwidth per algorithm and size on ``link``; ``*`` marks
    the selector's choice on ``pick`` (default ``link``: the link the selector sees)."""
    head = f"{'size':>10} " + " ".join(f"{a + ' time':>16} {'busbw':>7}" for a in algos)
    lines = [f"p={p} hosts={hosts}  (busbw in GB/s; * = the selector's choice)", head]
    for n in sizes:
        pick_ = selected(p, n, pick or link)
        cells = []
        for a in algos:
            pr = predict(a, p, n, link)
            mark = "*" if a == pick_ else " "
            cells.append(f"{_fmt_t(pr.seconds) + mark:>16} {_fmt_bw(pr.busbw):>7}")
        lines.append(f"{_human(n):>10} " + " ".join(cells))
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


#: the collectives ``--validate`` compares (bench's ``size``: the bytes the selector is
#: asked about, i.e. the whole gathered or scattered buffer for all_gather/reduce_scatter)
VALIDATED = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def hosts_links(
    p: int, hosts: int, transport: str = "auto", gamma: float | None = None
) -> tuple[Link, Link]:
    """:func:`shm_links` for ``p`` ranks over ``hosts`` hosts (contiguous, equal numbers),
    as the runtime builds their link (:func:`unison.link.two_level`: this host's
    calibrated TCP between hosts; within a host, shared memory unless ``transport`` is
    ``tcp``): the selector's, and predictions' (its intra-host link between processes)."""
    from .link import transport_link, two_level
    from .transport import calibrate

    calibrate.install()
    per = max(1, p // hosts)
    pick = two_level({r: f"h{r // per}" for r in range(p)}, transport_link("tcp"), transport)
    if pick is None:
        return shm_links(gamma)
    if gamma:
        pick = replace(pick, gamma=gamma, intra=replace(pick.intra, gamma=gamma))
    return pick, replace(pick, intra=pick.intra.between_processes())


def price(
    op: str,
    p: int,
    n: int,
    pick: Link,
    link: Link,
    small: int,
    forced: Mapping[str, str] | None = None,
) -> tuple[str, float]:
    """What runs for ``op`` on ``n`` bytes (the bench's size) and its predicted seconds on
    ``link``, the per-call overhead included: the slots (``slots``,
    :mod:`.algorithms.slot_path`) where the call fits ``small`` bytes (0: no slots, e.g.
    several hosts), else the algorithm ``forced`` names (``UNISON_ALGO``) or the
    selector's choice on ``pick`` (:func:`shm_links`, :func:`hosts_links`)."""
    at = link.at(n, p)
    if slot_path.uses_slots(op, p, n, small):
        return "slots", at.overhead + slot_path.cost(op, p, n, at)
    choice = choose(op, p, n, pick, forced or {})
    name = choice.name
    if op == "all_reduce":  # simulate's short names (rd, shm1)
        name = next((k for k, (_, sel) in ALGOS.items() if sel == name), name)
    return name, at.overhead + choice.module.cost(p, n, at)


def validate(path: str, gamma: float | None, small: int | None = None, hosts: int = 1) -> str:
    """Predicted vs measured unison rows of a bench JSON: per collective and size, what
    runs (:func:`price`: on one host the slots up to ``small`` bytes, default
    ``UNISON_SMALL_BYTES``, else the algorithm the bench forced or the selector picks)
    and its predicted time. Rows of ranks on several hosts (``hosts``, ``--hosts``: the
    bench's hosts, where their names do not tell them apart, e.g. network namespaces;
    else the host names the rows counted) are priced on those hosts' two-level link
    (:func:`hosts_links`), with the bench's transport."""
    with open(path) as f:
        data = json.load(f)
    if small is None:
        small = load_config().small_bytes
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    forced = load_config({"UNISON_ALGO": str(meta.get("algo") or "")}).algo_overrides()
    transport = str(meta.get("transport") or "auto")
    rows = data.get("rows", data) if isinstance(data, dict) else data
    lines = [
        f"{'op':>14} {'np':>3} {'size':>8} {'algo':>12} {'predicted':>11} {'measured':>11} "
        f"{'error':>7}"
    ]
    one_host = shm_links(gamma)
    spread_links: dict[tuple[int, int], tuple[Link, Link]] = {}  # (p, hosts): built once
    for row in rows:
        op = row.get("op")
        if op not in VALIDATED or row.get("impl", "unison") != "unison":
            continue
        if "time_us" not in row:
            continue
        p, n = int(row["np"]), int(row.get("bytes", row.get("size", 0)))
        spread = max(hosts, int(row.get("hostnames", 1) or 1))
        if spread > 1 and p % spread == 0:
            if (p, spread) not in spread_links:
                spread_links[p, spread] = hosts_links(p, spread, transport, gamma)
            pick, link = spread_links[p, spread]
            algo, pred = price(op, p, n, pick, link, 0, forced)
        else:
            pick, link = one_host
            algo, pred = price(op, p, n, pick, link, 0 if forced else small, forced)
        meas = float(row["time_us"]) * 1e-6
        err = (pred - meas) / meas
        lines.append(
            f"{op:>14} {p:>3} {_human(n):>8} {algo:>12} {_fmt_t(pred):>11} {_fmt_t(meas):>11} "
            f"{err * 100:>+6.0f}%"
        )
    return "\n".join(lines)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-np", "--np", type=int, default=8, help="number of ranks")
    p.add_argument("--hosts", type=int, default=1, help="hosts the ranks are spread over")
    p.add_argument(
        "--link",
        default="100Gbit,5us",
        help="network between hosts: BANDWIDTH,LATENCY (100Gbit,5us) or 'shm' (this machine)",
    )
    p.add_argument("--intra", default="", help="link between ranks of one host (300GB/s,1us)")
    p.add_argument("--size", default="1G", help="bytes: 1G, a list 1K,1M or a range 1K:1G (x4)")
    p.add_argument(
        "--algo", default="", help=f"comma list of {','.join(ALGOS)} (default: all that apply)"
    )
    p.add_argument("--gamma", default="", help="reduction speed per rank, e.g. 10GB/s")
    p.add_argument("--validate", default="", help="compare with a `unison bench --json` file")


def main(args: argparse.Namespace) -> int:
    gamma = 1 / parse_bandwidth(args.gamma) if args.gamma else None
    if args.validate:
        print(validate(args.validate, gamma, hosts=args.hosts))
        return 0
    link = build_link(args.np, args.hosts, args.link, args.intra, gamma)
    one_host = args.hosts == 1 and (args.intra or args.link) == "shm"
    pick = shm_links(gamma)[0] if one_host else None
    if args.algo:
        algos = [a.strip() for a in args.algo.split(",")]
        for a in algos:
            if a not in ALGOS:
                raise SystemExit(f"unison simulate: --algo {a!r}: known {', '.join(ALGOS)}")
    else:
        algos = [a for a in ALGOS if math.isfinite(ALGOS[a][0](args.np, 1 << 20, link))]
    print(table(args.np, args.hosts, _sizes(args.size), algos, link, pick))
    return 0
