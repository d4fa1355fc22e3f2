# mypy: disable-error-code="override, assignment"
"""``UnisonProcessGroup``: torch.distributed's ProcessGroup interface on unison's engine.

torch calls these methods with group ranks and option structs; each one maps to
the unison collective over the group's Communicator (global ranks), started
asynchronously and wrapped in a :class:`UnisonWork`. Tensors that unison cannot
use in place (non-contiguous, on a GPU, bfloat16) go through a contiguous CPU
copy that is copied back when the operation finishes; a bfloat16 tensor's copy is
float32, and its operation's signature still says bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..._types import ReduceOp
from ...buffers import Buffer, DType, as_buffer
from ...comm import collectives as _c
from ...comm.group import Group
from ...comm.work import Work as UWork
from ...errors import CollectiveTimeoutError, InvalidArgumentError, UnsupportedError
from ._profile import recorded
from ._rendezvous import explicit_timeout
from ._sparse import all_reduce_sparse, is_sparse
from ._work import DoneWork, UnisonWork, done_work, translate

__all__ = ["UnisonProcessGroup"]

_OPS = {
    "SUM": ReduceOp.SUM,
    "PRODUCT": ReduceOp.PRODUCT,
    "MIN": ReduceOp.MIN,
    "MAX": ReduceOp.MAX,
    "AVG": ReduceOp.AVG,
    "BAND": ReduceOp.BAND,
    "BOR": ReduceOp.BOR,
    "BXOR": ReduceOp.BXOR,
}


# by the RedOpType's integer value: hashing torch's enum costs a microsecond, int() less
_BY_VALUE = {int(getattr(dist.ReduceOp.RedOpType, n)): u for n, u in _OPS.items()}
_SUM = dist.ReduceOp.SUM


def _op(op: Any) -> ReduceOp:
    if op == _SUM:  # the usual case: one comparison
        return ReduceOp.SUM
    try:
        uop = _BY_VALUE.get(int(getattr(op, "op", op)))  # ReduceOp -> its RedOpType
    except (TypeError, ValueError):
        uop = None
    if uop is not None:
        return uop
    for name, uop in _OPS.items():
        if op == getattr(dist.ReduceOp, name):
            return uop
    raise UnsupportedError(
        f"unison: ReduceOp {op} is not supported (unison implements SUM, PRODUCT, MIN, MAX, "
        "AVG, BAND, BOR, BXOR; PREMUL_SUM is NCCL's: scale the tensor, then use SUM)"
    )


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


class HostStage:
    """Tensors as unison can use them, and the copies back afterwards."""

    def __init__(self) -> None:
        self.back: list[Callable[[], None]] = []

    def __call__(self, t: torch.Tensor, write: bool = True) -> torch.Tensor | Buffer:
        """``t`` itself, or a contiguous CPU copy of it. A bfloat16 tensor's copy is
        float32 and comes as a :class:`Buffer` declaring bfloat16: the operation's
        signature names the caller's dtype, so a rank that passed bfloat16 and one
        that passed float32 get a mismatch instead of a float32 operation."""
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type == "cpu" and t.is_contiguous() and t.dtype != torch.bfloat16:
            return t
        bf16 = t.dtype == torch.bfloat16
        tmp = t.detach().to("cpu", torch.float32 if bf16 else t.dtype, copy=True).contiguous()
        if write:
            self.back.append(lambda: _copy(t, tmp))
        if bf16:
            return replace(as_buffer(tmp), declared=DType.BFLOAT16)
        return tmp

    def finish(self) -> Callable[[], None] | None:
        if not self.back:
            return None
        back = self.back

        def run() -> None:
            for f in back:
                f()

        return run


def _direct(t: torch.Tensor) -> bool:
    """Whether unison can use ``t``'s own memory: a contiguous CPU tensor of a dtype it
    reduces natively (every one but bfloat16, which is staged as float32)."""
    return t.is_cpu and t.dtype is not torch.bfloat16 and t.is_contiguous()


def _listed(tensors: Any) -> list[torch.Tensor]:
    """torch's single-tensor call forms take a tensor where the options form takes a list."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _async(opts: Any) -> bool:
    """Whether torch will hand the Work back to the user (``async_op=True``, and every
    call from C++ such as DDP's); a blocking Python call runs inline, without a hand-off
    to the group's engine thread."""
    return True if opts is None else bool(getattr(opts, "asyncOp", True))


class UnisonProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on unison."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        comm: Group,
        default: bool,
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._comm = comm
        self._ranks = list(comm.ranks)
        self._timeout = timeout
        self._default = default

    # --- identity -----------------------------------------------------------------------
    @property
    def comm(self) -> Group:
        """The unison Group this process group runs on."""
        return self._comm

    @property
    def global_ranks(self) -> list[int]:
        """The group's members as global ranks, by group rank."""
        return self._ranks

    def getBackendName(self) -> str:
        return "unison"

    # torch keeps the name of a Python group in the group itself
    def setGroupName(self, name: str) -> None:
        self._group_name = str(name)

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = str(desc)

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"<UnisonProcessGroup rank {self.rank()} of {self.size()} ranks={self._ranks}>"

    def _global(self, group_rank: int, what: str) -> int:
        if not 0 <= int(group_rank) < len(self._ranks):
            raise InvalidArgumentError(
                f"{what}: group rank {group_rank} is outside 0..{len(self._ranks) - 1}"
            )
        return self._ranks[int(group_rank)]

    def _label(self, name: str) -> str:
        return f"{name} on rank {self._comm.global_rank}"

    def work_for(
        self,
        name: str,
        parts: Sequence[UWork | None],
        result: list[torch.Tensor],
        stage: HostStage,
        source: Callable[[], int] | None = None,
    ) -> UnisonWork:
        return UnisonWork(
            self._label(name),
            [p for p in parts if p is not None],
            result,
            stage.finish(),
            source,
        )

    def start_op(self, fn: Callable[..., UWork | None], *args: Any) -> UWork | None:
        try:
            return fn(*args)
        except Exception as exc:
            raise translate(exc) from None

    # --- collectives --------------------------------------------------------------------
    @recorded("broadcast")
    def broadcast(
        self, tensors: list[torch.Tensor], opts: Any, timeout: Any = None
    ) -> UnisonWork | DoneWork:
        try:
            root_rank = opts.rootRank
        except AttributeError:  # torch's (tensor, root) form
            root_rank, tensors, opts = int(opts), _listed(tensors), None
        if len(tensors) == 1 and _direct(tensors[0]):
            root = self._global(root_rank, "broadcast")
            try:
                part = _c.broadcast(self._comm, tensors[0], root, _async(opts))
            except Exception as exc:
                raise translate(exc) from None
            if part is None:
                return done_work("broadcast", tensors)
            return UnisonWork(self._label("broadcast"), [part], tensors)
        st, root = HostStage(), self._global(root_rank, "broadcast")
        bufs = [st(t) for t in tensors]
        parts = [self.start_op(_c.broadcast, self._comm, b, root, _async(opts)) for b in bufs]
        return self.work_for("broadcast", parts, tensors, st)

    @recorded("all_reduce")
    def allreduce(
        self, tensors: list[torch.Tensor], opts: Any = None, timeout: Any = None
    ) -> UnisonWork | DoneWork:
        # torch's C++ ProcessGroup.allreduce has three Python forms: (tensors, opts),
        # (tensors, op=SUM) and (tensor, op=SUM). A Python group receives the arguments
        # as given, so the single-tensor and ReduceOp forms are normalized here (DDP's
        # join hook calls ``process_group.allreduce(local_used_map)`` with one tensor;
        # iterating it would reduce its elements one by one)
        if opts is None:
            op, async_op = ReduceOp.SUM, True
            if isinstance(tensors, torch.Tensor):
                tensors = [tensors]
        else:  # SUM and asyncOp read here, not through _op/_async: the hot path
            try:
                rop = opts.reduceOp
                async_op = bool(getattr(opts, "asyncOp", True))
            except AttributeError:  # (tensor(s), ReduceOp)
                rop, async_op, opts, tensors = opts, True, None, _listed(tensors)
            op = ReduceOp.SUM if rop == _SUM else _op(rop)
        if len(tensors) == 1:
            t = tensors[0]
            if t.is_cpu and t.dtype is not torch.bfloat16 and t.is_contiguous():  # _direct
                # the common case: unison reduces the tensor's own memory (a numpy view),
                # in place; nothing to stage or copy back. A blocking call has finished
                # when this returns: torch gets an already completed Work
                try:
                    part = _c.all_reduce(self._comm, t, op, async_op)
                except Exception as exc:
                    raise translate(exc) from None
                if part is None:
                    return DoneWork("all_reduce", tensors)
                return UnisonWork(self._label("all_reduce"), [part], tensors)
        if any(is_sparse(t) for t in tensors):
            for t in tensors:
                self.start_op(all_reduce_sparse, self._comm, t, op)
            return done_work("all_reduce", tensors)
        st = HostStage()
        bufs = [st(t) for t in tensors]
        parts = [self.start_op(_c.all_reduce, self._comm, b, op, _async(opts)) for b in bufs]
        return self.work_for("all_reduce", parts, tensors, st)

    @recorded("all_reduce")
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> UnisonWork:
        op = _op(opts.reduceOp)
        st = HostStage()
        if not tensors:
            return self.work_for("all_reduce_coalesced", [], tensors, st)
        joined = torch.cat([t.detach().reshape(-1).to("cpu") for t in tensors])
        staged = st(joined, write=False)
        flat = staged.source if isinstance(staged, Buffer) else staged

        def back() -> None:
            off = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[off : off + n].view_as(t))
                off += n

        st.back.append(back)
        part = self.start_op(_c.all_reduce, self._comm, staged, op, _async(opts))
        return self.work_for("all_reduce_coalesced", [part], tensors, st)

    @recorded("reduce")
    def reduce(
        self, tensors: list[torch.Tensor], opts: Any, op: Any = _SUM, timeout: Any = None
    ) -> UnisonWork:
        try:
            rop, root_rank = opts.reduceOp, opts.rootRank
        except AttributeError:  # torch's (tensor, root, op=SUM) form
            rop, root_rank, tensors, opts = op, int(opts), _listed(tensors), None
        op, st = _op(rop), HostStage()
        root = self._global(root_rank, "reduce")
        bufs = [st(t) for t in tensors]
        parts = [self.start_op(_c.reduce, self._comm, b, root, op, _async(opts)) for b in bufs]
        return self.work_for("reduce", parts, tensors, st)

    @recorded("all_gather", 1)
    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any
    ) -> UnisonWork:
        st = HostStage()
        parts = []
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            o = [st(t) for t in outs]
            i = st(inp, write=False)
            parts.append(self.start_op(_c.all_gather, self._comm, o, i, _async(opts)))
        flat = [t for outs in output_tensors for t in outs]
        return self.work_for("all_gather", parts, flat, st)

    @recorded("all_gather", 1)
    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any
    ) -> UnisonWork:
        # torch's layout: output_lists[rank][k] receives input k of that rank
        if len(output_lists) != len(self._ranks) or any(
            len(o) != len(input_list) for o in output_lists
        ):
            raise InvalidArgumentError(
                f"all_gather_coalesced: output_tensor_lists must hold {len(self._ranks)} lists "
                f"(one per rank) of {len(input_list)} tensors (one per input)"
            )
        st = HostStage()
        parts = []
        for k, inp in enumerate(input_list):
            o = [st(outs[k]) for outs in output_lists]
            i = st(inp, write=False)
            parts.append(self.start_op(_c.all_gather, self._comm, o, i, _async(opts)))
        return self.work_for(
            "all_gather_coalesced", parts, [t for o in output_lists for t in o], st
        )

    @recorded("all_gather_into_tensor", 1)
    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> UnisonWork:
        st = HostStage()
        o, i = st(output), st(input, write=False)
        part = self.start_op(_c.all_gather_into_tensor, self._comm, o, i, _async(opts))
        return self.work_for("all_gather_into_tensor", [part], [output], st)

    @recorded("all_gather_into_tensor_coalesced", 1)
    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> UnisonWork:
        st = HostStage()
        parts = []
        for out, inp in zip(outputs, inputs, strict=True):
            o, i = st(out), st(inp, write=False)
            parts.append(self.start_op(_c.all_gather_into_tensor, self._comm, o, i, _async(opts)))
        return self.work_for("all_gather_into_tensor_coalesced", parts, list(outputs), st)

    @recorded("gather", 1)
    def gather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any
    ) -> UnisonWork:
        st = HostStage()
        root = self._global(opts.rootRank, "gather")
        i = st(input_tensors[0], write=False)
        outs = [st(t) for t in output_tensors[0]] if output_tensors else None
        part = self.start_op(_c.gather, self._comm, i, outs, root, _async(opts))
        flat = list(output_tensors[0]) if output_tensors else []
        return self.work_for("gather", [part], flat, st)

    @recorded("scatter", 1)
    def scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any
    ) -> UnisonWork:
        st = HostStage()
        root = self._global(opts.rootRank, "scatter")
        o = st(output_tensors[0])
        ins = [st(t, write=False) for t in input_tensors[0]] if input_tensors else None
        part = self.start_op(_c.scatter, self._comm, o, ins, root, _async(opts))
        return self.work_for("scatter", [part], list(output_tensors), st)

    @recorded("reduce_scatter", 1)
    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any
    ) -> UnisonWork:
        op, st = _op(opts.reduceOp), HostStage()
        parts = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            o = st(out)
            i = [st(t, write=False) for t in ins]
            parts.append(self.start_op(_c.reduce_scatter, self._comm, o, i, op, _async(opts)))
        return self.work_for("reduce_scatter", parts, list(output_tensors), st)

    @recorded("reduce_scatter_tensor", 1)
    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> UnisonWork:
        op, st = _op(dist.ReduceOp.SUM if opts is None else opts.reduceOp), HostStage()
        o, i = st(output), st(input, write=False)
        part = self.start_op(_c.reduce_scatter_tensor, self._comm, o, i, op, _async(opts))
        return self.work_for("reduce_scatter_tensor", [part], [output], st)

    @recorded("reduce_scatter_tensor_coalesced", 1)
    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> UnisonWork:
        op, st = _op(dist.ReduceOp.SUM if opts is None else opts.reduceOp), HostStage()
        parts = []
        for out, inp in zip(outputs, inputs, strict=True):
            o, i = st(out), st(inp, write=False)
            parts.append(
                self.start_op(_c.reduce_scatter_tensor, self._comm, o, i, op, _async(opts))
            )
        return self.work_for("reduce_scatter_tensor_coalesced", parts, list(outputs), st)

    @recorded("all_to_all", 1)
    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> UnisonWork:
        st = HostStage()
        o, i = st(output), st(input, write=False)
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        part = self.start_op(_c.all_to_all_single, self._comm, o, i, osz, isz, _async(opts))
        return self.work_for("all_to_all_single", [part], [output], st)

    @recorded("all_to_all", 1)
    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any
    ) -> UnisonWork:
        st = HostStage()
        o = [st(t) for t in output_tensors]
        i = [st(t, write=False) for t in input_tensors]
        part = self.start_op(_c.all_to_all, self._comm, o, i, _async(opts))
        return self.work_for("all_to_all", [part], list(output_tensors), st)

    @recorded("barrier", None)
    def barrier(self, opts: Any = None) -> UnisonWork | DoneWork:
        own, job = self._timeout.total_seconds(), self._comm.config.timeout
        bounded = 0 < own < job or (own == job and explicit_timeout(self._timeout))
        if _async(opts) or not bounded:
            part = self.start_op(_c.barrier, self._comm, _async(opts))
            if part is None:
                return done_work("barrier", [])
            return UnisonWork(self._label("barrier"), [part], [])
        # a group made with its own timeout (new_group(timeout=...)): a blocking barrier
        # raises once it has passed, in Gloo's words (torch's suite expects them)
        part = self.start_op(_c.barrier, self._comm, True)
        assert part is not None
        try:
            part.wait(own)
        except CollectiveTimeoutError:
            if own >= job and not part.is_completed():
                # the group's deadline is the engine's too: its verdict names who is missing
                try:
                    part.wait(1.0)
                except CollectiveTimeoutError:
                    pass
            err = part.exception() if part.is_completed() else None
            if err is not None and not isinstance(err, CollectiveTimeoutError):
                raise translate(err) from None
            detail = f" ({err})" if err is not None else ""
            raise translate(
                CollectiveTimeoutError(
                    f"barrier on rank {self._comm.global_rank} (group "
                    f"{self.getGroupName() or self._ranks}): Timed out after {own:g} s, the "
                    f"group's timeout, waiting for the other ranks{detail}",
                    op="barrier",
                    ranks=getattr(err, "ranks", None) or self._ranks,
                )
            ) from None
        except Exception as exc:
            raise translate(exc) from None
        return done_work("barrier", [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """torch's ``monitored_barrier``: raise naming the ranks that did not arrive."""
        from ._monitored import run

        run(self, timeout, wait_all_ranks)

    # --- point to point -----------------------------------------------------------------
    @recorded("send")
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> UnisonWork:
        st = HostStage()
        b = st(tensors[0], write=False)
        peer = self._global(dstRank, "send")

        return self.work_for(
            "send", [self.start_op(self._comm.isend, b, peer, tag)], list(tensors), st
        )

    @recorded("recv")
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> UnisonWork:
        st = HostStage()
        b = st(tensors[0])
        peer = self._global(srcRank, "recv")

        part = self.start_op(self._comm.irecv, b, peer, tag)
        return self.work_for("recv", [part], list(tensors), st, lambda: int(srcRank))

    @recorded("recvAnySource")
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> UnisonWork:
        from ._anysource import recv_anysource

        return recv_anysource(self, tensors, tag)

    # torch 2.13's names for the same calls
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    # --- lifecycle ----------------------------------------------------------------------
    def abort(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self._default:
            from ._rendezvous import leave

            leave()
