"""Negotiation: which tensors every rank has submitted, validated, in one order.

Pure logic, no threads and no I/O. Each rank describes a submitted tensor with a
:class:`TensorRequest`; the coordinator (rank 0 of the process set) keeps a
:class:`Coordinator` table of requests per name and, once every rank that has
not joined has submitted a name, turns the requests into one :class:`Response`
(or an error response naming the disagreement). Every rank executes the same
responses in the same order.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Coordinator",
    "RequestKind",
    "HvdOp",
    "TensorRequest",
    "Response",
    "join_error",
    "parse_splits",
    "reducescatter_rows",
    "request_of",
    "validate",
]


class HvdOp(enum.IntEnum):
    """Reduction ops, with Horovod's values (``hvd.Average`` is 0, ``hvd.Sum`` 1...)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


class RequestKind(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class TensorRequest:
    """One rank's submission of a named operation (a group of tensors for grouped ops)."""

    name: str
    kind: RequestKind
    dtype: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    op: int = 0
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    splits: tuple[int, ...] = ()  # alltoall: rows sent to each rank

    def rank_part(self) -> tuple[int, ...]:
        """What may legitimately differ between ranks (first dims, alltoall splits)."""
        if self.kind is RequestKind.ALLGATHER:
            return tuple(s[0] if s else 1 for s in self.shapes)
        if self.kind is RequestKind.ALLTOALL:
            return self.splits
        return ()

    def common(self) -> tuple[object, ...]:
        """What must be equal on every rank."""
        if self.kind in (RequestKind.ALLGATHER, RequestKind.ALLTOALL):
            shapes: object = tuple(s[1:] for s in self.shapes)
        else:
            shapes = self.shapes
        return (self.kind, self.dtype, shapes, self.op, self.root, self.prescale, self.postscale)

    @property
    def numel_hint(self) -> int:
        """Elements over all the shapes (not bytes)."""
        n = 0
        for s in self.shapes:
            k = 1
            for d in s:
                k *= d
            n += k
        return n


@dataclass(frozen=True)
class Response:
    """What every rank executes. ``per_rank[r]`` is rank r's :meth:`TensorRequest.rank_part`;
    ``joined`` the ranks that had joined (they contribute zeros / nothing)."""

    request: TensorRequest
    per_rank: tuple[tuple[int, ...], ...] = ()
    joined: tuple[int, ...] = ()
    error: str = ""
    value: int = -1  # join: the last rank to join

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def cacheable(self) -> bool:
        return (
            not self.error
            and not self.joined
            and self.request.kind not in (RequestKind.JOIN, RequestKind.BARRIER)
        )


def reducescatter_rows(rows: int, size: int) -> list[int]:
    """Rows of each rank's part; the first ``rows % size`` ranks get one more."""
    base, extra = divmod(rows, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def _describe(req: TensorRequest) -> str:
    parts = [req.kind.label, req.dtype or "-", "x".join(map(str, req.shapes)) or "()"]
    if req.kind in (RequestKind.ALLREDUCE, RequestKind.REDUCESCATTER):
        parts.append(f"op={HvdOp(req.op).name}")
        if req.prescale != 1.0 or req.postscale != 1.0:
            parts.append(f"scale={req.prescale:g}/{req.postscale:g}")
    if req.kind is RequestKind.BROADCAST:
        parts.append(f"root={req.root}")
    return " ".join(parts)


def validate(name: str, reqs: dict[int, TensorRequest], size: int, joined: Sequence[int]) -> str:
    """An error message if the ranks' requests disagree, else ''."""
    first = min(reqs)
    ref = reqs[first]
    for r in sorted(reqs):
        q = reqs[r]
        if q.common() != ref.common():
            what = []
            if q.kind != ref.kind:
                what.append("operation")
            if q.dtype != ref.dtype:
                what.append("dtype")
            if q.op != ref.op:
                what.append("reduce op")
            if q.root != ref.root:
                what.append("root rank")
            if q.common()[2] != ref.common()[2] or len(q.shapes) != len(ref.shapes):
                what.append("shape")
            if (q.prescale, q.postscale) != (ref.prescale, ref.postscale):
                what.append("scale factors")
            return (
                f"mismatched {' and '.join(what) or 'arguments'} for tensor {name!r}: "
                f"rank {first} submitted {_describe(ref)}, rank {r} submitted {_describe(q)}"
            )
    if ref.kind is RequestKind.ALLTOALL:
        for r, q in reqs.items():
            if len(q.splits) != size:
                return f"alltoall {name!r}: rank {r} gave {len(q.splits)} splits for {size} ranks"
    if joined:
        err = join_error(ref.kind)
        if err:
            return f"{err} (tensor {name!r}; joined ranks of the set: {list(joined)})"
        if ref.op == HvdOp.ADASUM and ref.kind is RequestKind.ALLREDUCE:
            return f"Adasum allreduce {name!r} is not supported after ranks {list(joined)} joined"
    return ""


def join_error(kind: RequestKind) -> str:
    """Horovod's error for an operation other than allreduce while some rank has joined."""
    if kind is RequestKind.ALLGATHER:
        return (
            "Allgather is not supported with Join at this time. "
            "Specify sparse_to_dense=True if using DistributedOptimizer"
        )
    if kind is RequestKind.BROADCAST:
        return "Broadcast is not supported with Join at this time."
    if kind is RequestKind.ALLTOALL:
        return "Alltoall is not supported with Join at this time."
    if kind is RequestKind.REDUCESCATTER:
        return "Reducescatter is not supported with Join at this time."
    return ""


@dataclass
class Coordinator:
    """Rank 0's table: requests per name and rank, joined ranks, readiness."""

    size: int
    table: dict[str, dict[int, TensorRequest]] = field(default_factory=dict)
    arrival: list[str] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)

    def add(self, rank: int, reqs: Iterable[TensorRequest]) -> None:
        for q in reqs:
            if q.kind is RequestKind.JOIN:
                if rank not in self.joined:
                    self.joined.append(rank)
                continue
            slot = self.table.get(q.name)
            if slot is None:
                slot = self.table[q.name] = {}
                self.arrival.append(q.name)
            slot[rank] = q

    @property
    def busy(self) -> bool:
        return bool(self.table) or bool(self.joined)

    def missing(self, name: str) -> list[int]:
        have = self.table.get(name, {})
        return [r for r in range(self.size) if r not in have and r not in self.joined]

    def ready(self, force_error: dict[str, str] | None = None) -> list[Response]:
        """Responses for every name all non-joined ranks have submitted, in arrival order."""
        out: list[Response] = []
        joined = tuple(sorted(self.joined))
        for name in list(self.arrival):
            reqs = self.table[name]
            forced = (force_error or {}).get(name)
            if forced is None and self.missing(name):
                continue
            if forced is None and not reqs:
                continue
            self.arrival.remove(name)
            del self.table[name]
            ref = reqs[min(reqs)] if reqs else TensorRequest(name, RequestKind.BARRIER)
            if forced is not None:
                out.append(Response(ref, error=forced))
                continue
            err = validate(name, reqs, self.size, joined)
            if err:
                out.append(Response(ref, error=err))
                continue
            per_rank: tuple[tuple[int, ...], ...] = ()
            if ref.kind in (RequestKind.ALLGATHER, RequestKind.ALLTOALL):
                zero = tuple(0 for _ in ref.rank_part())
                per_rank = tuple(
                    reqs[r].rank_part() if r in reqs else zero for r in range(self.size)
                )
            out.append(Response(ref, per_rank=per_rank, joined=joined))
        if self.joined and len(self.joined) == self.size:
            out.append(Response(TensorRequest("__join__", RequestKind.JOIN), value=self.joined[-1]))
            self.joined = []
        return out


def request_of(resp: Response, rank: int) -> TensorRequest:
    """Rank ``rank``'s request that a cached response stands for."""
    q = resp.request
    if q.kind is RequestKind.ALLGATHER and resp.per_rank:
        dims = resp.per_rank[rank]
        return _replace(q, shapes=tuple((d, *s[1:]) for d, s in zip(dims, q.shapes, strict=True)))
    if q.kind is RequestKind.ALLTOALL and resp.per_rank:
        return _replace(q, splits=resp.per_rank[rank])
    return q


def _replace(q: TensorRequest, **changes: object) -> TensorRequest:
    import dataclasses

    return dataclasses.replace(q, **changes)  # type: ignore[arg-type]


def parse_splits(splits: Any) -> list[int]:
    """Alltoall splits as ints: a 1-D integer tensor, or a sequence of ints."""
    if hasattr(splits, "is_floating_point"):  # a torch tensor
        if splits.is_floating_point() or splits.is_complex() or str(splits.dtype) == "torch.bool":
            raise ValueError(f"splits must be a tensor of integers, got {splits.dtype}")
        if splits.dim() != 1:
            raise ValueError(f"splits must be a 1-D tensor, got {splits.dim()} dimensions")
        return [int(x) for x in splits.tolist()]
    try:
        items = list(splits)
    except TypeError:
        raise ValueError(f"splits must be a sequence of integers, got {splits!r}") from None
    out = []
    for x in items:
        if isinstance(x, (bool, float)):
            raise ValueError(f"splits must be a sequence of integers, got {splits!r}")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise ValueError(f"splits must be a sequence of integers, got {splits!r}") from None
    return out
