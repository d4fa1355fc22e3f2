"""What to measure: operations, sizes, dtype, iterations — and the nccl-tests formulas.

Sizes follow nccl-tests: the *size* of a row is the whole buffer — the output of
an all-gather, the input of a reduce-scatter, one rank's send buffer of an
all-to-all. ``algbw = size / time``; ``busbw = algbw × factor`` with the factor
below (2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and
all-to-all, 1 for broadcast and send/recv), so bus bandwidth compares across
world sizes. A barrier carries no payload: it is measured once per run, as a row of
size 0 (its time is the figure; no bandwidth).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from ..errors import InvalidArgumentError

__all__ = [
    "DTYPES",
    "LIST_OPS",
    "OPS",
    "BenchSpec",
    "base_op",
    "bus_factor",
    "default_iters",
    "parse_size",
    "parse_sizes",
]

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "sendrecv",
    "barrier",
)
#: the list forms (all_gather into a list of blocks, reduce_scatter from one): named in
#: ``--ops`` only (not in ``all``); the same bytes and result as their base operation
LIST_OPS = ("all_gather_list", "reduce_scatter_list")
DTYPES = ("float32", "float64", "float16", "int32", "int64")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def base_op(op: str) -> str:
    """The operation a list form computes (``all_gather_list`` → ``all_gather``)."""
    return op.removesuffix("_list")


def bus_factor(op: str, n: int) -> float:
    op = base_op(op)
    if op == "all_reduce":
        return 2 * (n - 1) / n if n > 1 else 1.0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n if n > 1 else 1.0
    return 1.0


def parse_size(text: str) -> int:
    """``"8"``, ``"64K"``, ``"16M"``, ``"1G"`` (also ``"16MB"``, ``"16MiB"``) → bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise InvalidArgumentError(f"bad size {text!r} (e.g. 8, 64K, 16M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """``"8:256M"`` → 8, 16, … 256 MiB (× ``factor``); ``"1K,1M"`` → those two."""
    if factor < 2:
        raise InvalidArgumentError(f"--step-factor must be >= 2, got {factor}")
    if ":" in text:
        lo_s, hi_s = text.split(":", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo < 1 or hi < lo:
            raise InvalidArgumentError(f"bad size range {text!r}")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= factor
        return out
    out = [parse_size(t) for t in text.split(",") if t.strip()]
    if not out or min(out) < 1:
        raise InvalidArgumentError(f"bad size list {text!r}")
    return out


def default_iters(nbytes: int) -> int:
    if nbytes <= 64 << 10:
        return 200
    if nbytes <= 4 << 20:
        return 40
    if nbytes <= 64 << 20:
        return 10
    return 5


@dataclass(frozen=True)
class BenchSpec:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str = "float32"
    iters: int = 0  # 0: by size (default_iters)
    warmup: int = 5
    check: int = 1  # iterations checked against the expected result (nccl-tests' -c); 0: none

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchSpec:
        d = json.loads(text)
        return cls(
            tuple(d["ops"]), tuple(d["sizes"]), d["dtype"], d["iters"], d["warmup"], int(d["check"])
        )

    def iters_for(self, nbytes: int) -> int:
        return self.iters if self.iters > 0 else default_iters(nbytes)
