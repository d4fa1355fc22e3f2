"""The collectives: validate every argument, then hand the buffers to the job's engine.

Validation happens before anything is sent, on the caller's thread, and raises
:class:`InvalidArgumentError`. The validated buffers then go to a
:class:`~unison.comm.backend.Backend`: the native engine (algorithms chosen by cost, run
in issue order by the group's executor, :mod:`unison.backends.native`) or an external one
(``mpi``, ``torch``) when ``unison.init(backend=...)`` picked it. Signatures (op,
dtype, count, reduce op, root) ride in every native frame so ranks that disagree
get a :class:`MismatchError`.

A group whose engine runs small blocking collectives in the caller's thread
(:attr:`Group.caller_thread`, a :class:`~unison.comm.backend.CallerThread`) gets them
there: the first blocking call of a signature is validated in full and prepared by
the engine; later calls of that signature on plain numpy arrays find the prepared
call by signature and check only what can change between calls of one signature
(the array's contiguity and writability) before running it. A buffer staged in
another dtype than its caller's (:attr:`Buffer.declared`) takes the general path, whose
signature names the caller's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._types import OpCode, ReduceOp
from ..buffers import Buffer, DType, as_buffer, check_op
from ..errors import InvalidArgumentError
from .agree import guard
from .group import Group
from .work import Work

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "issue",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
]


def _op(op: Any) -> ReduceOp:
    try:
        return ReduceOp(op)
    except (ValueError, TypeError):
        raise InvalidArgumentError(f"op must be a unison.ReduceOp, got {op!r}") from None


def _list(
    comm: Group, items: Any, what: str, ref: Buffer, *, writable: bool, equal: bool = True
) -> list[Buffer]:
    if not isinstance(items, (list, tuple)):
        raise InvalidArgumentError(f"{what} must be a list of {comm.size} buffers")
    if len(items) != comm.size:
        raise InvalidArgumentError(
            f"{what} has {len(items)} entries; group {comm.id} has {comm.size} ranks"
        )
    out = [_as(comm, x, f"{what}[{i}]", writable=writable) for i, x in enumerate(items)]
    for i, b in enumerate(out):
        if b.dtype is not ref.dtype:
            raise InvalidArgumentError(
                f"{what}[{i}] is {b.dtype.label}, the buffer is {ref.dtype.label}"
            )
        if equal and b.count != ref.count:
            raise InvalidArgumentError(
                f"{what}[{i}] has {b.count} elements, the buffer has {ref.count}"
            )
    return out


def _split(arr: np.ndarray, parts: int, each: int) -> list[np.ndarray]:
    return [arr[i * each : (i + 1) * each] for i in range(parts)]


def issue(work: Work, async_op: bool, outputs: Any = ()) -> Work | None:
    """The one place that decides between returning the Work and waiting on it
    (blocking = non-blocking + wait; an idle engine may run a blocking call in the
    caller's thread). ``outputs``: the buffers the operation writes, what
    :meth:`Work.result` returns."""
    if async_op:
        work.outputs = list(outputs)
        work.start(caller_waits=False)
        return work
    work.start(caller_waits=True)
    work.wait()
    return None


def _as(comm: Group, obj: Any, what: str, *, writable: bool = True, device: bool = False) -> Buffer:
    """:func:`as_buffer`; ``device``: a whole-buffer operation that lets GPU tensors
    through when the group's engine moves device memory itself (torch/NCCL)."""
    ok = device and comm.backend.accepts_device_buffers
    return as_buffer(obj, what, writable=writable, device_ok=ok)


def broadcast(comm: Group, buf: Any, src: int, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op and type(buf) is np.ndarray and type(src) is int:
        call = ct.calls.get((OpCode.BROADCAST, buf.dtype, buf.shape, src))  # validated
        if call is not None:
            flags = buf.flags
            if flags.c_contiguous and flags.writeable and ct.run(call, buf, buf):
                return None
    comm.require_member("broadcast")
    b = _as(comm, buf, "broadcast buffer", device=True)
    root = comm.group_rank(src, "src")
    if ct is not None and not async_op and b.declared is None:
        arr, key = _signature(OpCode.BROADCAST, buf, b, comm.ranks[root])
        call = ct.prepared(key, OpCode.BROADCAST, arr, b.nbytes, b.dtype, root=comm.ranks[root])
        if call is not None and ct.run(call, arr, arr):
            return None
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.BROADCAST, b.sig_dtype, b.count, root=comm.ranks[root])
    return issue(comm.backend.broadcast(comm, b, root), async_op, [b.source])


def _signature(op: OpCode, buf: Any, b: Buffer, *extra: Any) -> tuple[np.ndarray, tuple[Any, ...]]:
    """The array a caller-thread call runs on and its signature key: a plain numpy
    array as given (the key the fast check above finds later), else the buffer's flat
    view (a torch CPU tensor's storage, validated on every call)."""
    if type(buf) is np.ndarray:
        return buf, (op, buf.dtype, buf.shape, *extra)
    return b.array, (op, "buffer", b.dtype, b.count, *extra)


def all_reduce(comm: Group, buf: Any, op: Any, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op and type(buf) is np.ndarray and type(op) is ReduceOp:
        call = ct.calls.get((OpCode.ALL_REDUCE, buf.dtype, buf.shape, op))  # validated
        if call is not None:
            flags = buf.flags
            if flags.c_contiguous and flags.writeable and ct.run(call, buf, buf):
                return None
    comm.require_member("all_reduce")
    b = _as(comm, buf, "all_reduce buffer", device=True)
    rop = _op(op)
    check_op(rop, b.dtype)
    if ct is not None and not async_op and b.declared is None:
        arr, key = _signature(OpCode.ALL_REDUCE, buf, b, rop)
        call = ct.prepared(key, OpCode.ALL_REDUCE, arr, b.nbytes, b.dtype, rop)
        if call is not None and ct.run(call, arr, arr):
            return None
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.ALL_REDUCE, b.sig_dtype, b.count, rop)
    return issue(comm.backend.all_reduce(comm, b, rop), async_op, [b.source])


def all_reduce_pieces(
    comm: Group,
    srcs: Sequence[np.ndarray],
    dsts: Sequence[np.ndarray],
    dtype: DType,
    op: ReduceOp,
    finish: Callable[[np.ndarray], None] | None = None,
) -> bool:
    """Reduce the arrays ``srcs`` (laid end to end) over ``comm`` as one buffer into
    ``dsts`` (``dsts[i]`` may be ``srcs[i]``), where they lie, then ``finish`` the
    result in place; blocking.
    Many tensors reduced as one without a fusion buffer. False, with nothing done,
    where the group's engine would need them packed into one buffer (the caller
    packs them and calls :func:`all_reduce`)."""
    comm.require_member("all_reduce")
    check_op(op, dtype)
    if comm.broken is not None or not comm.backend.checks_signatures:
        return False  # the one-buffer path agrees first and reports the breakage
    work = comm.backend.all_reduce_pieces(comm, srcs, dsts, dtype, op, finish)
    if work is None:
        return False
    issue(work, False)
    return True


def reduce(comm: Group, buf: Any, dst: int, op: Any, async_op: bool) -> Work | None:
    comm.require_member("reduce")
    b = _as(comm, buf, "reduce buffer", device=True)
    rop = _op(op)
    check_op(rop, b.dtype)
    root = comm.group_rank(dst, "dst")
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.REDUCE, b.sig_dtype, b.count, rop, comm.ranks[root])
    return issue(comm.backend.reduce(comm, b, root, rop), async_op, [b.source])


def _allgather_submit(
    comm: Group, b: Buffer, blocks: list[np.ndarray], async_op: bool, result: Any
) -> Work | None:
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.ALL_GATHER, b.sig_dtype, b.count)
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    return issue(comm.backend.all_gather(comm, b, blocks, result), async_op, outputs)


def _plain_blocks(items: Any, parts: int, ref: np.ndarray, writable: bool) -> bool:
    """Whether ``items`` is a list of ``parts`` plain numpy arrays, each of ``ref``'s
    dtype and size, contiguous (and writable: ``writable``), which a list form's
    prepared call takes as they are (the check of what can change between calls of one
    validated signature)."""
    if type(items) is not list or len(items) != parts:
        return False
    dtype, size = ref.dtype, ref.size
    for x in items:
        if type(x) is not np.ndarray or x.dtype != dtype or x.size != size:
            return False
        flags = x.flags
        if not flags.c_contiguous or (writable and not flags.writeable):
            return False
    return True


def all_gather(comm: Group, out_list: Any, buf: Any, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op and type(buf) is np.ndarray:
        call = ct.calls.get((OpCode.ALL_GATHER, "list", buf.dtype, buf.shape))  # validated
        if (
            call is not None
            and buf.flags.c_contiguous
            and _plain_blocks(out_list, comm.size, buf, writable=True)
            and ct.run(call, buf, out_list)
        ):
            return None
    comm.require_member("all_gather")
    b = _as(comm, buf, "all_gather buffer", writable=False)
    outs = _list(comm, out_list, "all_gather output list", b, writable=True)
    blocks = [o.array for o in outs]
    if ct is not None and not async_op and b.declared is None:
        key: tuple[Any, ...]
        if type(buf) is np.ndarray and buf.flags.c_contiguous:
            # the key the check above finds on later calls of this signature
            arr, key = buf, (OpCode.ALL_GATHER, "list", buf.dtype, buf.shape)
        else:
            arr, key = b.array, (OpCode.ALL_GATHER, "list", b.dtype, b.array.dtype, b.count)
        call = ct.prepared(key, OpCode.ALL_GATHER, arr, b.nbytes, b.dtype, gather_list=True)
        if call is not None and ct.run(call, arr, blocks):
            return None
    return _allgather_submit(comm, b, blocks, async_op, out_list)


def all_gather_into_tensor(comm: Group, out: Any, buf: Any, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op and type(out) is np.ndarray and type(buf) is np.ndarray:
        call = ct.calls.get((OpCode.ALL_GATHER, buf.dtype, buf.shape, out.dtype, out.size))
        if call is not None:  # validated
            flags = out.flags
            if (
                flags.c_contiguous
                and flags.writeable
                and buf.flags.c_contiguous
                and ct.run(call, buf, out)
            ):
                return None
    comm.require_member("all_gather_into_tensor")
    b = _as(comm, buf, "all_gather input", writable=False)
    o = _as(comm, out, "all_gather output")
    if o.dtype is not b.dtype or o.count != b.count * comm.size:
        raise InvalidArgumentError(
            f"all_gather output must hold {comm.size} x {b.count} {b.dtype.label} elements, "
            f"got {o.count} {o.dtype.label}"
        )
    if ct is not None and not async_op and b.declared is None:
        plain = type(out) is np.ndarray and type(buf) is np.ndarray
        inp, dst = (buf, out) if plain else (b.array, o.array)
        key: tuple[Any, ...] = (
            (OpCode.ALL_GATHER, buf.dtype, buf.shape, out.dtype, out.size)
            if plain
            else (OpCode.ALL_GATHER, "buffer", b.dtype, b.count)
        )
        call = ct.prepared(key, OpCode.ALL_GATHER, inp, b.nbytes, b.dtype)
        if call is not None and ct.run(call, inp, dst):
            return None
    return _allgather_submit(comm, b, _split(o.array, comm.size, b.count), async_op, out)


def _rooted_list(
    comm: Group, items: Any, what: str, ref: Buffer, is_root: bool, *, writable: bool
) -> list[Buffer] | None:
    if is_root:
        if items is None:
            raise InvalidArgumentError(f"{what} is required on the root rank")
        return _list(comm, items, what, ref, writable=writable)
    if items:
        raise InvalidArgumentError(f"{what} must not be given on non-root ranks")
    return None


def gather(comm: Group, buf: Any, gather_list: Any, dst: int, async_op: bool) -> Work | None:
    me = comm.require_member("gather")
    b = _as(comm, buf, "gather buffer", writable=False)
    root = comm.group_rank(dst, "dst")
    outs = _rooted_list(comm, gather_list, "gather_list", b, me == root, writable=True)
    blocks = None if outs is None else [o.array for o in outs]
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.GATHER, b.sig_dtype, b.count, root=comm.ranks[root])
    outputs = [o.source for o in outs or ()]
    return issue(comm.backend.gather(comm, b, blocks, root), async_op, outputs)


def scatter(comm: Group, buf: Any, scatter_list: Any, src: int, async_op: bool) -> Work | None:
    me = comm.require_member("scatter")
    b = _as(comm, buf, "scatter buffer")
    root = comm.group_rank(src, "src")
    ins = _rooted_list(comm, scatter_list, "scatter_list", b, me == root, writable=False)
    blocks = None if ins is None else [i.array for i in ins]
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.SCATTER, b.sig_dtype, b.count, root=comm.ranks[root])
    return issue(comm.backend.scatter(comm, b, blocks, root), async_op, [b.source])


def _reduce_scatter_submit(
    comm: Group, o: Buffer, blocks: list[np.ndarray], rop: ReduceOp, async_op: bool
) -> Work | None:
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.REDUCE_SCATTER, o.sig_dtype, o.count, rop)
    return issue(comm.backend.reduce_scatter(comm, o, blocks, rop), async_op, [o.source])


def reduce_scatter(comm: Group, out: Any, in_list: Any, op: Any, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op and type(out) is np.ndarray and type(op) is ReduceOp:
        call = ct.calls.get((OpCode.REDUCE_SCATTER, "list", out.dtype, out.shape, op))
        if call is not None:  # validated
            flags = out.flags
            if (
                flags.c_contiguous
                and flags.writeable
                and _plain_blocks(in_list, comm.size, out, writable=False)
                and ct.run(call, in_list, out)
            ):
                return None
    comm.require_member("reduce_scatter")
    o = _as(comm, out, "reduce_scatter output")
    rop = _op(op)
    check_op(rop, o.dtype)
    ins = _list(comm, in_list, "reduce_scatter input list", o, writable=False)
    blocks = [i.array for i in ins]
    if ct is not None and not async_op and o.declared is None:
        key: tuple[Any, ...]
        if type(out) is np.ndarray and out.flags.c_contiguous:
            # the key the check above finds on later calls of this signature
            arr, key = out, (OpCode.REDUCE_SCATTER, "list", out.dtype, out.shape, rop)
        else:
            arr, key = (
                o.array,
                (OpCode.REDUCE_SCATTER, "list", o.dtype, o.array.dtype, o.count, rop),
            )
        call = ct.prepared(key, OpCode.REDUCE_SCATTER, arr, o.nbytes * comm.size, o.dtype, rop)
        if call is not None and ct.run(call, blocks, arr):
            return None
    return _reduce_scatter_submit(comm, o, blocks, rop, async_op)


def reduce_scatter_tensor(
    comm: Group, out: Any, inbuf: Any, op: Any, async_op: bool
) -> Work | None:
    ct = comm.caller_thread
    if (
        ct is not None
        and not async_op
        and type(out) is np.ndarray
        and type(inbuf) is np.ndarray
        and type(op) is ReduceOp
    ):
        key: tuple[Any, ...] = (
            OpCode.REDUCE_SCATTER,
            out.dtype,
            out.shape,
            inbuf.dtype,
            inbuf.size,
            op,
        )
        call = ct.calls.get(key)
        if call is not None:  # validated
            flags = out.flags
            if (
                flags.c_contiguous
                and flags.writeable
                and inbuf.flags.c_contiguous
                and ct.run(call, inbuf if inbuf.ndim == 1 else inbuf.reshape(-1), out)
            ):
                return None
    comm.require_member("reduce_scatter_tensor")
    o = _as(comm, out, "reduce_scatter output")
    i = _as(comm, inbuf, "reduce_scatter input", writable=False)
    rop = _op(op)
    check_op(rop, o.dtype)
    if i.dtype is not o.dtype or i.count != o.count * comm.size:
        raise InvalidArgumentError(
            f"reduce_scatter input must hold {comm.size} x {o.count} {o.dtype.label} "
            f"elements, got {i.count} {i.dtype.label}"
        )
    if ct is not None and not async_op and o.declared is None:
        plain = type(out) is np.ndarray and type(inbuf) is np.ndarray
        dst = out if plain else o.array
        key = (
            (OpCode.REDUCE_SCATTER, out.dtype, out.shape, inbuf.dtype, inbuf.size, rop)
            if plain
            else (OpCode.REDUCE_SCATTER, "buffer", o.dtype, o.count, rop)
        )
        call = ct.prepared(key, OpCode.REDUCE_SCATTER, dst, i.nbytes, o.dtype, rop)
        if call is not None and ct.run(call, i.array, dst):
            return None
    return _reduce_scatter_submit(comm, o, _split(i.array, comm.size, o.count), rop, async_op)


def _alltoall_submit(
    comm: Group,
    outs: list[np.ndarray],
    ins: list[np.ndarray],
    ref: Buffer,
    async_op: bool,
    result: Any,
) -> Work | None:
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.ALL_TO_ALL, ref.sig_dtype)
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    return issue(comm.backend.all_to_all(comm, outs, ins, result, ref), async_op, outputs)


def all_to_all(comm: Group, out_list: Any, in_list: Any, async_op: bool) -> Work | None:
    comm.require_member("all_to_all")
    if not isinstance(in_list, (list, tuple)) or not in_list:
        raise InvalidArgumentError(f"all_to_all input list must hold {comm.size} buffers")
    ref = _as(comm, in_list[0], "all_to_all input list[0]", writable=False)
    ins = _list(comm, in_list, "all_to_all input list", ref, writable=False, equal=False)
    outs = _list(comm, out_list, "all_to_all output list", ref, writable=True, equal=False)
    return _alltoall_submit(
        comm, [o.array for o in outs], [i.array for i in ins], ref, async_op, out_list
    )


def _splits(b: Buffer, sizes: Sequence[int] | None, parts: int, what: str) -> list[np.ndarray]:
    shape = b.shape
    rows = shape[0] if shape else 1
    row = b.count // rows if rows else 0
    if sizes is None:
        if rows % parts:
            raise InvalidArgumentError(
                f"{what}: first dimension {rows} is not divisible by {parts} ranks; "
                "give split sizes"
            )
        sizes = [rows // parts] * parts
    sizes = [int(s) for s in sizes]
    if len(sizes) != parts or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise InvalidArgumentError(
            f"{what}: split sizes {sizes} must be {parts} non-negative ints summing to {rows}"
        )
    out, off = [], 0
    for s in sizes:
        out.append(b.array[off * row : (off + s) * row])
        off += s
    return out


def all_to_all_single(
    comm: Group,
    out: Any,
    inbuf: Any,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    async_op: bool,
) -> Work | None:
    comm.require_member("all_to_all_single")
    i = _as(comm, inbuf, "all_to_all input", writable=False)
    o = _as(comm, out, "all_to_all output")
    if o.dtype is not i.dtype:
        raise InvalidArgumentError(
            f"all_to_all output is {o.dtype.label}, input is {i.dtype.label}"
        )
    ins = _splits(i, input_split_sizes, comm.size, "all_to_all input")
    outs = _splits(o, output_split_sizes, comm.size, "all_to_all output")
    return _alltoall_submit(comm, outs, ins, i, async_op, out)


def barrier(comm: Group, async_op: bool) -> Work | None:
    ct = comm.caller_thread
    if ct is not None and not async_op:
        call = ct.calls.get((OpCode.BARRIER,))  # a member's: validated
        if call is not None and ct.run(call, None, None):
            return None
    comm.require_member("barrier")
    if ct is not None and not async_op:
        call = ct.prepared((OpCode.BARRIER,), OpCode.BARRIER, _NO_DATA, 0, DType.UINT8)
        if call is not None and ct.run(call, None, None):
            return None
    if comm.broken is not None or not comm.backend.checks_signatures:
        guard(comm, OpCode.BARRIER)
    return issue(comm.backend.barrier(comm), async_op)


_NO_DATA = np.empty(0, np.uint8)
