"""The blocking small-message path on shared memory: one slot per rank and a sequence number.

When every rank of a group shares one host and nothing else is in flight, a
small blocking collective needs no request objects, framing or matching: each
rank writes its contribution (and the operation's signature) into its own
peer-visible slot, publishes the call's sequence number, waits until every
peer has published the same number, checks the signatures agree, and reads —
reduces, gathers or copies — straight out of the peers' slots.

Layout of each rank's region (:func:`region_bytes`): a 64-byte header (``seq``,
u32 at 0; ``sleepers``, u32 at 4) and two halves, each a 16-byte header
(signature, payload bytes) and ``slot_bytes`` of payload. Call ``k`` uses half
``k % 2``. A rank writes half ``h`` in call ``k`` only after every peer
published ``k − 1``, which a peer does only after it finished reading call
``k − 2``, the last use of half ``h``; so peers are never more than one call
apart and a peer's ``seq`` is always ``k`` or ``k + 1`` once it has arrived.

Waiting follows :class:`~.wait_policy.WaitPolicy` (spin, then ``sched_yield``,
then sleep on the ``seq`` word of the peer still missing, its ``sleepers`` flag set
first, which that peer wakes when it publishes; a bounded sleep, :data:`SLEEP_S`,
covers a lost wake-up); every wait has a deadline and ends in
:class:`~unison.errors.CollectiveTimeoutError` naming the rank, the operation
and the peers not heard from. Results are reduced in rank order, as the direct
shared-memory algorithms do, so every rank ends bitwise identical.

Memory ordering: the payload is stored before ``seq`` and read after it; x86
keeps stores and loads in order, and the Python interpreter executes a full
bytecode (with its own memory barriers around the GIL) between the two.

One module for the whole protocol (publish, wait, compare, read): the wait is part
of the same state machine as the publish and shares its state.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .._types import ReduceOp
from ..buffers import DType, from_numpy, reducer
from ..errors import CollectiveTimeoutError, InvalidArgumentError, MismatchError
from ..jobenv import host_cores
from . import futex
from .wait_policy import WaitPolicy

__all__ = ["SeqSlots", "SlotPlan", "SlotWatch", "region_bytes"]

_HEAD = 64
_HALF_HEAD = 16

_ALL_REDUCE, _BROADCAST, _ALL_GATHER, _REDUCE_SCATTER, _BARRIER = range(5)
_NAMES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier")


#: what finishes a call once every peer arrived: (every rank's views, the caller's output)
_Finish = Callable[[list[np.ndarray], Any], None]


_MASK = 0xFFFFFFFF
#: a sleeping waiter re-checks this often (bounds a lost wake-up)
SLEEP_S = 0.005
#: a waiter looks for failures elsewhere and at its deadline this often
CHECK_S = 0.001
# a store-load fence: an uncontended lock's acquire and release (a locked instruction
# on x86-64; the futex call fences the waiter's side; SLEEP_S bounds a miss elsewhere)
_FENCE = threading.Lock()
_fence_in, _fence_out = _FENCE.acquire, _FENCE.release


def region_bytes(slot_bytes: int) -> int:
    """Bytes of one rank's region for payloads up to ``slot_bytes``."""
    half = (_HALF_HEAD + slot_bytes + 63) // 64 * 64
    return _HEAD + 2 * half


class SlotWatch(Protocol):
    """The caller's view of one call: failures learnt elsewhere, and its error texts."""

    def check(self) -> None:
        """Raise if the call already failed elsewhere (an abort, a lost peer)."""

    def late(self, pending: list[int]) -> BaseException:
        """The error for a deadline passed while ``pending`` (local ranks) were silent."""
        ...

    def mismatch(self, peer: int, theirs: int) -> BaseException:
        """The error for ``peer`` having published the signature word ``theirs``."""
        ...


def _sig(kind: int, op: int, dtype: int, nbytes: int, root: int) -> int:
    return (kind << 56) | (op << 48) | (dtype << 40) | (root << 32) | (nbytes & _MASK)


class SlotPlan:
    """One call signature on these slots, worked out once and run many times
    (:meth:`SeqSlots.plan`, :meth:`SeqSlots.run`): the signature word, this rank's
    write targets and the views the result is read from, per half, and what finishes
    the call (reduce, gather or copy out; None: nothing)."""

    __slots__ = ("finish", "mine", "sig", "srcs")

    def __init__(
        self,
        sig: int,
        mine: tuple[np.ndarray, np.ndarray] | None,
        srcs: tuple[list[np.ndarray], list[np.ndarray]],
        finish: _Finish | None,
    ) -> None:
        self.sig, self.mine, self.srcs, self.finish = sig, mine, srcs, finish


class SeqSlots:
    """One group's slots: ``regions[q]`` is local rank ``q``'s region, mapped here.

    ``alive``: returns why a peer is gone (or None), checked while waiting long.
    """

    def __init__(
        self,
        rank: int,
        regions: Sequence[memoryview],
        slot_bytes: int,
        *,
        alive: Callable[[], str | None] | None = None,
        oversubscribed: bool | None = None,
        adapt: bool = False,
    ) -> None:
        self.rank, self.size, self.slot_bytes = rank, len(regions), slot_bytes
        need = region_bytes(slot_bytes)
        if any(len(r) < need for r in regions):
            raise InvalidArgumentError(f"every region needs {need} bytes")
        self._half = (region_bytes(slot_bytes) - _HEAD) // 2
        self._seq = [ctypes.c_uint32.from_buffer(r, 0) for r in regions]
        self._sleepers = [ctypes.c_uint32.from_buffer(r, 4) for r in regions]
        self._addrs = [ctypes.addressof(s) for s in self._seq]
        self._bytes = [np.frombuffer(r, np.uint8, need) for r in regions]
        #: each rank's two half headers as signed 64-bit words: [signature, caller's key]
        offs = [_HEAD + h * self._half for h in (0, 1)]
        self._heads = [[r[o : o + _HALF_HEAD].cast("q") for o in offs] for r in regions]
        self._k = self._seq[rank].value
        self._alive = alive
        if oversubscribed is None:
            oversubscribed = self.size > host_cores()
        #: ``adapt``: where ranks outnumber cores, choose between one yield before the
        #: futex and yield-polling by the time per call each gives (UNISON_WAIT_ADAPT)
        self.policy = WaitPolicy(oversubscribed, adapt)
        #: the waits of the large direct algorithms' round barriers (:meth:`barrier` with
        #: ``rounds``): a peer there is copying a whole chunk, so their waits are long and
        #: would teach :attr:`policy` (the small collectives') the wrong budgets
        self.round_policy = WaitPolicy(oversubscribed)
        if not oversubscribed:
            self.policy.poll_s = poll_cost(self._seq[rank])
        self.peers = [q for q in range(self.size) if q != rank]
        # what every call touches, looked up once
        self._my_seq, self._my_sleepers = self._seq[rank], self._sleepers[rank]
        self._my_addr, self._my_heads = self._addrs[rank], self._heads[rank]
        self._peer_seqs = [self._seq[q] for q in self.peers]
        self._peer_seq_items = [(q, self._seq[q]) for q in self.peers]
        self._peer_heads = [[(q, self._heads[q][h]) for q in self.peers] for h in (0, 1)]
        #: set by the caller for the calls that follow (None: this module's own errors)
        self.watch: SlotWatch | None = None
        #: set by the caller when peers are known to be busy for a while (a round of a
        #: large direct algorithm): the wait sleeps on the futex at once
        self.patient = False
        self._plans: dict[tuple[object, ...], SlotPlan] = {}

    # --- the one primitive ------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.slot_bytes

    def _payload(self, q: int, h: int, nbytes: int) -> np.ndarray:
        off = _HEAD + h * self._half + _HALF_HEAD
        return self._bytes[q][off : off + nbytes]

    def _views(
        self, h: int, off: int, count: int, dtype: np.dtype, shape: tuple[int, ...]
    ) -> list[np.ndarray]:
        """Every rank's payload in half ``h`` from byte ``off``: ``count`` elements of
        ``dtype`` in ``shape`` (views into the shared regions)."""
        nb = count * dtype.itemsize
        if off + nb > self.slot_bytes:
            raise InvalidArgumentError(f"{off + nb} bytes do not fit a {self.slot_bytes}-byte slot")
        return [
            self._payload(q, h, off + nb)[off:].view(dtype).reshape(shape) for q in range(self.size)
        ]

    def plan(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        dt: DType,
        op: ReduceOp = ReduceOp.SUM,
        root: int = 0,
        gather_list: bool = False,
    ) -> SlotPlan:
        """The :class:`SlotPlan` of one call signature (made once, then cached): ``name`` the
        collective (all_reduce, broadcast, all_gather, reduce_scatter, barrier), ``shape`` and
        ``dtype`` are the caller's buffer's (all_reduce, broadcast: the data; all_gather:
        the input; reduce_scatter: the output), ``dt`` what it holds."""
        key = (name, shape, dtype, dt, op, root, gather_list)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        kind = _NAMES.index(name)
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        me, halves = self.rank, (0, 1)
        flat = (count,)
        finish: _Finish | None = None
        if kind == _REDUCE_SCATTER:
            total = (count * self.size,)
            mine = tuple(self._views(h, 0, count * self.size, dtype, total)[me] for h in halves)
            srcs = tuple(self._views(h, me * nbytes, count, dtype, shape) for h in halves)
            finish = reducer(op, dt, self.size)
            sig = _sig(kind, op, dt, nbytes * self.size, 0)
        else:
            srcs = tuple(
                self._views(h, 0, count, dtype, flat if kind == _ALL_GATHER else shape)
                for h in halves
            )
            mine = tuple(self._views(h, 0, count, dtype, shape)[me] for h in halves)
            if kind == _ALL_REDUCE:
                finish = reducer(op, dt, self.size)
            elif kind == _BROADCAST:
                if me != root:
                    mine = None
                    finish = _copy_from(root)
            elif kind == _ALL_GATHER:
                finish = _gather_list if gather_list else _gather
            else:
                mine = None
            sig = _sig(
                kind, op if kind == _ALL_REDUCE else 0, dt if kind != _BARRIER else 0, nbytes, root
            )
        plan = SlotPlan(sig, mine, srcs, finish)  # type: ignore[arg-type]
        if len(self._plans) > 256:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def run(
        self,
        plan: SlotPlan,
        inp: np.ndarray | Sequence[np.ndarray] | None,
        out: object,
        timeout: float,
        key: int,
        policy: WaitPolicy | None = None,
    ) -> None:
        """One call of ``plan``: publish ``inp`` (an array of the plan's shape, or blocks
        laid end to end; ignored where this rank contributes nothing: a broadcast's
        receivers, a barrier), wait for every peer, finish into ``out``."""
        k = (self._k + 1) & _MASK
        h = k & 1
        mine = plan.mine
        if mine is not None:  # this rank contributes bytes
            if type(inp) is np.ndarray:
                mine[h][...] = inp
            elif type(inp) is list:  # a list form's blocks, of the plan's dtype and sizes
                _concatenate(inp, axis=None, out=mine[h])
            else:
                self._write(h, inp)  # type: ignore[arg-type]
        self._sync(k, h, plan.sig, timeout, key, policy or self.policy)
        finish = plan.finish
        if finish is not None:
            finish(plan.srcs[h], out)

    def _write(self, h: int, data: np.ndarray | Sequence[np.ndarray]) -> None:
        """This rank's bytes into its half ``h``: blocks laid end to end."""
        if isinstance(data, np.ndarray):
            data = [data]
        total = sum(int(b.nbytes) for b in data)
        if total > self.slot_bytes:
            raise InvalidArgumentError(f"{total} bytes do not fit a {self.slot_bytes}-byte slot")
        dst = self._payload(self.rank, h, total)
        at = 0
        for b in data:
            dst[at : at + b.nbytes] = b.reshape(-1).view(np.uint8)
            at += b.nbytes

    def _sync(self, k: int, h: int, sig: int, timeout: float, key: int, policy: WaitPolicy) -> None:
        """Publish call ``k`` (this rank's payload already in half ``h``), wait for every
        peer to publish it too, and compare every peer's signature words with ours."""
        head = self._my_heads[h]
        head[0] = sig
        head[1] = key
        self._my_seq.value = k
        _fence_in()
        _fence_out()
        if self._my_sleepers.value:
            self._my_sleepers.value = 0
            futex.wake(self._my_addr, 1 << 20)
        n = policy.polls  # the spin phase, inline, for all peers (0: spinning does not pay)
        for seq in self._peer_seqs:
            if (seq.value - k) & _MASK > 1:
                while n:
                    if (seq.value - k) & _MASK <= 1:
                        break
                    n -= 1
                else:
                    self._wait(k, sig, timeout, policy, policy.polls > 0)
                    break
        self._k = k
        for q, theirs in self._peer_heads[h]:
            if theirs[0] != sig or theirs[1] != key:
                self._disagree(q, theirs[0], theirs[1], sig, key)

    def _wait(
        self, k: int, sig: int, timeout: float, policy: WaitPolicy, spun: bool = False
    ) -> None:
        """Until every peer published ``k``: spin, yield, then sleep; deadline-bound.

        Only waits that had to wait get here (and teach ``policy``): a call whose
        peers had all arrived returns without reading the clock, and so does one whose
        peers arrived within the caller's inline polls (``spun``: those ran, this wait
        starts at its yield phase)."""
        start = now = time.monotonic()
        deadline = start + timeout
        patient = self.patient
        if patient:  # the caller expects a long wait: sleep at once, learn nothing
            spin_end = yield_end = start
        else:
            spin_end = start if spun else start + policy.spin_s
            yield_end = spin_end + policy.yield_s
        check_at = start + CHECK_S
        yields = policy.yields
        blocked = False
        for q, seq in self._peer_seq_items:  # all must arrive: wait for each in turn
            n = 0
            while (seq.value - k) & _MASK > 1:
                n += 1
                if now < spin_end:
                    if n & 7 == 0:  # a few cheap polls between clock reads
                        now = time.monotonic()
                    continue
                now = time.monotonic()
                if now >= check_at:  # failures elsewhere, the deadline: now and then
                    check_at = now + CHECK_S
                    self.check_failures(k, sig, timeout, now >= deadline)
                if now < yield_end and yields > 0:
                    yields -= 1
                    os.sched_yield()
                    continue
                blocked = True  # sleep until this peer publishes (or a bounded re-check)
                seen = seq.value
                self._sleepers[q].value = 1
                if (seen - k) & _MASK > 1:
                    futex.wait(self._addrs[q], seen, min(SLEEP_S, max(deadline - now, 1e-4)))
        if not patient:
            end = time.monotonic()
            policy.observe(end - start, blocked, k, end)

    def _disagree(self, q: int, their_sig: int, their_key: int, sig: int, key: int) -> None:
        watch = self.watch
        if watch is not None:
            raise watch.mismatch(q, their_key)
        if their_sig == sig:
            return  # without a watch only the slot's own signature counts
        raise MismatchError(
            f"rank {self.rank}: {self._describe(sig)} but rank {q} called "
            f"{self._describe(their_sig)}",
            op=_NAMES[sig >> 56],
            ranks=(q,),
        )

    def _arrived(self, q: int, k: int) -> bool:
        return ((self._seq[q].value - k) & _MASK) <= 1

    def check_failures(self, k: int, sig: int, timeout: float, late: bool) -> None:
        """Raise if the call failed elsewhere, a peer is gone or (``late``) the deadline passed."""
        watch = self.watch
        if watch is not None:
            watch.check()
        if late:
            self._late(k, sig, timeout, None)
        if self._alive is not None:
            gone = self._alive()
            if gone is not None:
                self._late(k, sig, timeout, gone)

    def _late(self, k: int, sig: int, timeout: float, gone: str | None) -> None:
        pending = [q for q in self.peers if not self._arrived(q, k)]
        if self.watch is not None and gone is None:
            raise self.watch.late(pending)
        why = gone or f"timed out after {timeout:g} s waiting for ranks {pending}"
        raise CollectiveTimeoutError(
            f"rank {self.rank}: {_NAMES[sig >> 56]} {why}", op=_NAMES[sig >> 56], ranks=pending
        )

    def _describe(self, sig: int) -> str:
        kind, op, dt = sig >> 56, (sig >> 48) & 0xFF, (sig >> 40) & 0xFF
        what = _NAMES[kind]
        if kind in (_ALL_REDUCE, _REDUCE_SCATTER):
            what += f"({ReduceOp(op).name})"
        if dt:
            what += f" of {DType(dt).name.lower()}"
        return f"{what} of {sig & _MASK} bytes (root {(sig >> 32) & 0xFF})"

    # --- collectives (blocking, in place where the API is) -----------------------------------
    def _dtype(self, arr: np.ndarray, dtype: DType | None) -> DType:
        if dtype is not None:
            return dtype
        dt = from_numpy(arr.dtype)
        if dt is None or not arr.flags.c_contiguous:
            raise InvalidArgumentError(f"unsupported buffer {arr.dtype} (contiguous numpy)")
        return dt

    def all_reduce(
        self,
        arr: np.ndarray,
        op: ReduceOp = ReduceOp.SUM,
        timeout: float = 300.0,
        key: int = 0,
        dtype: DType | None = None,
    ) -> None:
        """``dtype``: what ``arr``'s storage holds (e.g. bfloat16 in uint16), if not its own."""
        dt = self._dtype(arr, dtype)
        plan = self.plan("all_reduce", arr.shape, arr.dtype, dt, op)
        self.run(plan, arr, arr, timeout, key)

    def broadcast(
        self,
        arr: np.ndarray,
        root: int,
        timeout: float = 300.0,
        key: int = 0,
        dtype: DType | None = None,
    ) -> None:
        dt = self._dtype(arr, dtype)
        plan = self.plan("broadcast", arr.shape, arr.dtype, dt, root=root)
        self.run(plan, arr, arr, timeout, key)

    def all_gather(
        self,
        inp: np.ndarray,
        out: np.ndarray | Sequence[np.ndarray],
        timeout: float = 300.0,
        key: int = 0,
        dtype: DType | None = None,
    ) -> None:
        """``out``: one array of size × input elements, or one block per rank."""
        dt = self._dtype(inp, dtype)
        many = not isinstance(out, np.ndarray)
        if isinstance(out, np.ndarray) and (
            out.size != inp.size * self.size or out.dtype != inp.dtype
        ):
            raise InvalidArgumentError("all_gather: output must hold size × input elements")
        plan = self.plan("all_gather", inp.shape, inp.dtype, dt, gather_list=many)
        self.run(plan, inp, out, timeout, key)

    def reduce_scatter(
        self,
        inp: np.ndarray | Sequence[np.ndarray],
        out: np.ndarray,
        op: ReduceOp = ReduceOp.SUM,
        timeout: float = 300.0,
        key: int = 0,
        dtype: DType | None = None,
    ) -> None:
        """``inp``: one array of size × output elements, or one block per rank."""
        dt = self._dtype(out, dtype)
        if isinstance(inp, np.ndarray):
            if inp.size != out.size * self.size or out.dtype != inp.dtype:
                raise InvalidArgumentError("reduce_scatter: input must hold size × output elements")
            inp = inp.reshape(-1)
        plan = self.plan("reduce_scatter", out.shape, out.dtype, dt, op)
        self.run(plan, inp, out, timeout, key)

    def barrier(self, timeout: float = 300.0, key: int = 0, rounds: bool = False) -> None:
        """``rounds``: a large algorithm's round barrier (waits on :attr:`round_policy`)."""
        plan = self.plan("barrier", (0,), _U8, DType.UINT8)
        self.run(plan, None, None, timeout, key, self.round_policy if rounds else None)


_U8 = np.dtype(np.uint8)


def _copy_from(root: int) -> _Finish:
    def copy(srcs: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = srcs[root]

    return copy


#: numpy's concatenate without its __array_function__ dispatch (plain arrays only here)
_concatenate = getattr(np.concatenate, "_implementation", np.concatenate)


def _gather(srcs: list[np.ndarray], out: np.ndarray) -> None:
    _concatenate(srcs, out=out if out.ndim == 1 else out.reshape(-1))


def _gather_list(srcs: list[np.ndarray], outs: Sequence[np.ndarray]) -> None:
    for q, src in enumerate(srcs):
        outs[q].reshape(-1)[...] = src


def poll_cost(word: ctypes.c_uint32, polls: int = 256) -> float:
    """Seconds one poll of a slot word takes here (what the inline polls before a
    sleeping wait run): the mean of ``polls`` polls, timed once."""
    k = word.value
    t = time.perf_counter()
    n = polls
    while n:
        if (word.value - k) & _MASK > 1:
            break
        n -= 1
    return (time.perf_counter() - t) / polls
