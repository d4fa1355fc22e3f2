"""The worker's handle on the parameter server: :class:`KVStore`.

Keys are strings; values are numpy arrays or torch CPU tensors of any shape.
Every worker finds a key's servers with :func:`unison.ps.partition.layout` and
talks to them directly; a push or pull of several keys sends one request per
server involved and completes when all have answered.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from ..buffers import DType, as_buffer
from ..comm.group import Group
from ..comm.work import Work, joined
from ..errors import InvalidArgumentError
from . import checkpoint
from .connection import ServerConnection
from .consistency import Consistency
from .partition import Piece, home, layout
from .rules import Rule
from .wire import PsOp

__all__ = ["KVStore"]


@dataclass(frozen=True)
class _Meta:
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: tuple[Piece, ...]


def _key_names(keys: str | Iterable[str], what: str) -> list[str]:
    names = [keys] if isinstance(keys, str) else list(keys)
    for k in names:
        if not isinstance(k, str) or not k:
            raise InvalidArgumentError(f"{what}: keys must be non-empty strings, got {k!r}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{what}: a key appears twice in {names}")
    return names


class KVStore:
    """A worker's connection to the parameter servers (from :func:`unison.ps.init`)."""

    def __init__(
        self,
        comm: Group,
        workers: Sequence[int],
        servers: Sequence[int],
        consistency: Consistency,
        split_bytes: int,
        worker_id: int | None = None,
    ) -> None:
        self.comm = comm
        self.workers = tuple(workers)
        self.servers = tuple(servers)
        #: this worker's id: its index among the first workers (0 .. num_workers - 1); a
        #: worker that joined an elastic job later has the id it was started with
        self.rank = self.workers.index(comm.global_rank) if worker_id is None else worker_id
        #: the number of worker ids in the job when this worker joined it
        self.num_workers = len(self.workers)
        #: the clock this worker joined a running elastic job at (None: it started with it)
        self.joined_at: int | None = None
        self.num_servers = len(self.servers)
        self.consistency = consistency
        self.split_bytes = split_bytes
        self._clock = 0
        self._metas: dict[str, _Meta] = {}
        self._servers = [ServerConnection(comm, s, i) for i, s in enumerate(self.servers)]
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"<unison.ps.KVStore worker {self.rank}/{self.num_workers} "
            f"servers={list(self.servers)} {self.consistency!r} clock={self._clock}>"
        )

    @property
    def current_clock(self) -> int:
        """How many times this worker has called :meth:`clock`."""
        return self._clock

    def _join(self) -> None:
        """Enter a running elastic job: every server registers this worker and offers the
        clock it may start at; it starts at the largest offer and says so to every server."""
        calls = [ch.request(PsOp.JOIN, "ps.init (join)", 0) for ch in self._servers]
        for c in calls:
            c.wait()
        offers = [c.result() for c in calls]
        self._clock = max(int(o["clock"]) for o in offers)
        self.num_workers = max(int(o["workers"]) for o in offers)
        self.joined_at = self._clock
        for ch in self._servers:
            ch.notify(PsOp.CLOCK, self._clock)

    # --- key metadata ------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self._closed:
            raise InvalidArgumentError(f"{what}: this KVStore is closed")

    def _remember(self, name: str, shape: Sequence[int], dtype: str) -> _Meta:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if len(shape) else 1
        pieces = layout(name, count, dt.itemsize, self.num_servers, self.split_bytes)
        meta = _Meta(tuple(int(s) for s in shape), dt, pieces)
        self._metas[name] = meta
        return meta

    def _claim(
        self, keys: Mapping[str, tuple[tuple[int, ...], str] | None], what: str = "init_params"
    ) -> list[Work]:
        """Ask each key's home about it (claiming the ones given a shape); one call per home.
        ``what`` is the user's operation, which an error names."""
        by_home: dict[int, list[dict[str, Any]]] = {}
        for name, spec in keys.items():
            entry: dict[str, Any] = {"k": name}
            if spec is not None:
                entry["shape"], entry["dtype"] = list(spec[0]), spec[1]
            by_home.setdefault(home(name, self.num_servers), []).append(entry)
        return [
            self._servers[h].request(PsOp.CLAIM, what, self._clock, {"keys": entries})
            for h, entries in sorted(by_home.items())
        ]

    def _lookup(self, names: Iterable[str], what: str) -> None:
        missing = [n for n in names if n not in self._metas]
        if not missing:
            return
        for call in self._claim(dict.fromkeys(missing), what):
            call.wait()
            for k in call.result()["keys"]:
                self._remember(str(k["k"]), k["shape"], k["dtype"])

    # --- initialisation ------------------------------------------------------------------------
    def init_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Create keys with first values; the first worker to write a key wins.

        Every worker then holds the stored values: writable arrays/tensors given
        here are overwritten with them, and the returned dict maps every key to
        its stored value (the caller's buffer where it could be written).
        """
        self._check_open("init_params")
        names = _key_names(list(params), "init_params")
        bufs = {k: as_buffer(params[k], f"init_params[{k!r}]", writable=False) for k in names}
        for k, b in bufs.items():
            if b.dtype is DType.BFLOAT16:
                raise InvalidArgumentError(
                    f"init_params[{k!r}]: bfloat16 is not supported by the parameter server; "
                    "use float32 or float16"
                )
        specs = {k: (tuple(b.shape), b.array.dtype.str) for k, b in bufs.items()}
        for call in self._claim(specs):
            won: list[str] = []
            for k in call.result()["keys"]:
                name = str(k["k"])
                meta = self._remember(name, k["shape"], k["dtype"])
                if (meta.shape, meta.dtype.str) != specs[name]:
                    raise InvalidArgumentError(
                        f"init_params: key {name!r} already exists as {meta.dtype} of shape "
                        f"{meta.shape}, not {np.dtype(specs[name][1])} of shape {specs[name][0]} "
                        "(the first writer wins)"
                    )
                if k["won"]:
                    won.append(name)
            if won:
                self._send_initial(won, bufs)
                home_channel = self._servers[home(won[0], self.num_servers)]
                home_channel.request(PsOp.COMMIT, "init_params", self._clock, {"keys": won}).wait()
        out = {
            k: params[k]
            for k in names
            if not (isinstance(params[k], np.ndarray) and not params[k].flags.writeable)
        }
        pulled = self.pull(names, out=out)
        return {k: pulled[k] for k in names}

    def _send_initial(self, names: list[str], bufs: Mapping[str, Any]) -> None:
        per_server: dict[int, tuple[list[dict[str, Any]], list[np.ndarray]]] = {}
        for name in names:
            meta, flat = self._metas[name], bufs[name].array
            for p in meta.pieces:
                specs, arrays = per_server.setdefault(p.server, ([], []))
                specs.append(
                    {"k": name, "p": p.index, "start": p.start, "stop": p.stop, "shape": meta.shape}
                )
                arrays.append(flat[p.start : p.stop])
        calls = [
            self._servers[s].request(
                PsOp.INIT,
                "init_params",
                self._clock,
                {"pieces": specs, "arrays": [[a.dtype.str, a.size] for a in arrays]},
                arrays,
            )
            for s, (specs, arrays) in sorted(per_server.items())
        ]
        for c in calls:
            c.wait()

    # --- push and pull -------------------------------------------------------------------------
    def ipush(self, grads: Mapping[str, Any]) -> Work:
        """Start pushing ``{key: value}``; the Work completes when every server has it.

        Do not modify the pushed buffers until then.
        """
        self._check_open("push")
        names = _key_names(list(grads), "push")
        self._lookup(names, "push")
        per_server: dict[int, tuple[list[list[Any]], list[np.ndarray]]] = {}
        for name in names:
            b = as_buffer(grads[name], f"push[{name!r}]", writable=False)
            meta = self._metas[name]
            if b.shape != meta.shape or b.array.dtype != meta.dtype:
                raise InvalidArgumentError(
                    f"push: key {name!r} holds {meta.dtype} of shape {meta.shape}; "
                    f"got {b.array.dtype} of shape {b.shape}"
                )
            for p in meta.pieces:
                specs, arrays = per_server.setdefault(p.server, ([], []))
                specs.append([name, p.index])
                arrays.append(b.array[p.start : p.stop])
        calls = [
            self._servers[s].request(
                PsOp.PUSH,
                "push",
                self._clock,
                {"pieces": specs, "arrays": [[a.dtype.str, a.size] for a in arrays]},
                arrays,
            )
            for s, (specs, arrays) in sorted(per_server.items())
        ]
        return joined(f"push {names}", calls)

    def push(self, grads: Mapping[str, Any]) -> None:
        """Push ``{key: value}`` and wait until every server has it (see :meth:`ipush`)."""
        self.ipush(grads).wait()

    def ipull(
        self, keys: str | Iterable[str] | Mapping[str, Any], out: Mapping[str, Any] | None = None
    ) -> Work:
        """Start pulling keys; ``Work.result()`` is ``{key: value}``.

        ``keys`` is a name, a list of names, or ``{name: buffer}`` to pull into
        those buffers; ``out`` also names destination buffers. Keys without one
        arrive in new numpy arrays.
        """
        self._check_open("pull")
        if isinstance(keys, Mapping):
            out = {**keys, **(out or {})}
        names = _key_names(list(keys) if isinstance(keys, Mapping) else keys, "pull")
        out = dict(out or {})
        self._lookup(names, "pull")
        result: dict[str, Any] = {}
        per_server: dict[int, tuple[list[list[Any]], list[np.ndarray]]] = {}
        for name in names:
            meta = self._metas[name]
            if name in out:
                b = as_buffer(out[name], f"pull out[{name!r}]", writable=True)
                if b.shape != meta.shape or b.array.dtype != meta.dtype:
                    raise InvalidArgumentError(
                        f"pull: key {name!r} holds {meta.dtype} of shape {meta.shape}; "
                        f"the buffer given is {b.array.dtype} of shape {b.shape}"
                    )
                flat, result[name] = b.array, out[name]
            else:
                arr = np.empty(meta.shape, meta.dtype)
                flat, result[name] = arr.reshape(-1), arr
            for p in meta.pieces:
                specs, sinks = per_server.setdefault(p.server, ([], []))
                specs.append([name, p.index])
                sinks.append(flat[p.start : p.stop])
        calls = [
            self._servers[s].request(PsOp.PULL, "pull", self._clock, {"pieces": specs}, sinks=sinks)
            for s, (specs, sinks) in sorted(per_server.items())
        ]
        return joined(f"pull {names}", calls, result)

    def pull(
        self, keys: str | Iterable[str] | Mapping[str, Any], out: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Pull keys and wait; ``{key: value}`` (see :meth:`ipull`)."""
        work = self.ipull(keys, out)
        work.wait()
        result: dict[str, Any] = work.result()
        return result

    def clock(self) -> int:
        """End this worker's current step; returns the new clock."""
        self._check_open("clock")
        self._clock += 1
        for ch in self._servers:
            ch.notify(PsOp.CLOCK, self._clock)
        return self._clock

    def barrier(self) -> None:
        """Wait until every worker still in the job has called ``barrier`` as many times."""
        self._check_open("barrier")
        self._servers[0].request(PsOp.BARRIER, "barrier", self._clock).wait()

    # --- configuration, placement, checkpoints ------------------------------------------------
    def set_optimizer(self, rule: Rule) -> None:
        """Make the servers apply ``rule`` to every push (SGD, Adam, Sum, Assign, Custom)."""
        self._check_open("set_optimizer")
        if not isinstance(rule, Rule):
            raise InvalidArgumentError(
                f"set_optimizer expects a unison.ps rule (SGD, Adam, Sum, Assign, Custom), "
                f"got {type(rule).__name__}"
            )
        blob = np.frombuffer(pickle.dumps(rule, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        blob = blob.copy()
        meta = {"arrays": [[blob.dtype.str, blob.size]]}
        calls = [
            ch.request(PsOp.RULE, "set_optimizer", self._clock, meta, [blob])
            for ch in self._servers
        ]
        for c in calls:
            c.wait()

    def placement(self) -> dict[str, list[tuple[int, int, int]]]:
        """Where each key this worker knows lives: ``[(server rank, start, stop), ...]``.

        ``start``/``stop`` index the key's flattened elements.
        """
        return {
            k: [(self.servers[p.server], p.start, p.stop) for p in m.pieces]
            for k, m in sorted(self._metas.items())
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Each server writes its pieces under directory ``path`` (read with :func:`load`)."""
        self._check_open("save")
        where = os.path.abspath(os.fspath(path))
        calls = [
            ch.request(PsOp.SAVE, "save", self._clock, {"path": where}) for ch in self._servers
        ]
        keys: dict[str, dict[str, Any]] = {}
        for c in calls:
            c.wait()
            keys.update(c.result().get("keys", {}))
        checkpoint.write_manifest(where, self.num_servers, keys)

    # --- leaving -------------------------------------------------------------------------------
    def close(self, error: BaseException | None = None) -> None:
        """Leave the job: tell every server (with ``error`` if this worker is failing)."""
        if self._closed:
            return
        self._closed = True
        meta = {"failed": True, "reason": repr(error)[:500]} if error is not None else None
        calls = [ch.request(PsOp.BYE, "close", self._clock, meta) for ch in self._servers]
        for c in calls:
            try:
                c.wait()
            except Exception:
                pass
        for ch in self._servers:
            ch.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(
        self,
        tp: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(exc)
