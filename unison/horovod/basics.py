"""init/shutdown, ranks and sizes, capability queries, and process sets: the part of
Horovod's API every front end (torch, TensorFlow, Keras) shares.

Capability queries answer as Horovod's do. ``*_built()`` say what this installation
can use (MPI: mpi4py importable, unison's ``mpi`` backend; Gloo: torch.distributed
with Gloo, unison's ``torch`` backend); ``mpi_enabled()``/``gloo_enabled()`` say
whether this job's bytes move over MPI / Gloo at run time (False before
:func:`init`, and on unison's own ``native`` engine). NCCL, CUDA, ROCm, oneCCL and DDL:
the engine moves host memory, so they answer False (``nccl_built()``: 0, Horovod's
"no NCCL version").
"""

from __future__ import annotations

import atexit
import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

import unison as _un

from ..errors import InvalidArgumentError, NotInitializedError
from ..jobenv import host_cores
from .engine import HorovodEngine
from .settings import Settings, load_settings
from .timeline import Timeline

__all__ = [
    "ProcessSet",
    "add_process_set",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "engine_has_core",
    "engine_of",
    "process_set_by_id",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "remove_process_set",
    "rocm_built",
    "settings",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


class ProcessSet:
    """A subset of ranks that runs collectives of its own (``process_set=`` everywhere).

    Create it with the global ranks it holds; every rank of the job registers it
    with :func:`add_process_set` (or ``init(process_sets=[...])``), in the same order.
    """

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self.ranks: list[int] | None = None if ranks is None else sorted(int(r) for r in ranks)
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"process set ranks must be distinct, got {list(ranks or [])}")
        self.process_set_id: int | None = None

    def _members(self) -> list[int]:
        if self.ranks is None:
            return list(range(_un.size()))
        return self.ranks

    def size(self) -> int:
        return len(self._members())

    def rank(self) -> int:
        """This process's rank within the set (-1 if it is not a member)."""
        me = _un.rank()
        members = self._members()
        return members.index(me) if me in members else -1

    def included(self) -> bool:
        return _un.rank() in self._members()

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProcessSet)
            and other.process_set_id == self.process_set_id
            and (other.ranks == self.ranks)
        )

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owns_runtime = False
        self.settings: Settings | None = None
        self.engines: dict[int, HorovodEngine] = {}
        self.sets: dict[int, ProcessSet] = {}
        self.next_id = 1
        self.timeline: Timeline | None = None


_S = _State()


def _require() -> Settings:
    if _S.settings is None:
        raise NotInitializedError(
            "Horovod is not initialized: call hvd.init() first (run under `unison run`)"
        )
    return _S.settings


def settings() -> Settings:
    return _require()


def _cores() -> int:
    return host_cores()


def engine_has_core() -> bool:
    """Whether this rank's engine thread has a core beside the rank's computation: this
    host has more cores than ranks (else the engine only takes turns with the
    computation on its core)."""
    return _un.local_size() < _cores()


def _control_group(members: list[int]) -> _un.Group:
    """The set's negotiation group: only small collectives and point-to-point messages
    run on it, so it reserves no shared arena (no /dev/shm)."""
    return _un.new_group(members, shared_arena=False)


def _make_engine(ps: ProcessSet) -> None:
    members = ps._members()
    ctl = _control_group(members)
    data = _un.new_group(members)
    if _un.rank() in members:
        assert _S.settings is not None
        tl = _S.timeline if ps.process_set_id == 0 and members.index(_un.rank()) == 0 else None
        eng = HorovodEngine(members, _un.rank(), ctl, data, _S.settings, tl)
        eng.channel.sleep_wait = _un.local_size() > _cores()
        eng.start()
        assert ps.process_set_id is not None
        _S.engines[ps.process_set_id] = eng


def init(
    comm: Any = None,
    process_sets: Sequence[ProcessSet] | None = None,
) -> None:
    """Join the job (``unison.init``) and start the engine; idempotent.

    ``comm`` (an MPI communicator or a list of ranks in Horovod) is accepted for
    compatibility; only ``None`` or the full list of ranks is supported.
    """
    with _S.lock:
        if _S.settings is not None:
            return
        if not _un.is_initialized():
            _un.init()
            _S.owns_runtime = True
        if comm is not None and list(comm) != list(range(_un.size())):
            raise InvalidArgumentError(
                "hvd.init(comm=...) with a subset of ranks is not supported; use process sets"
            )
        _S.settings = load_settings()
        if _S.settings.timeline and _un.rank() == 0:
            _S.timeline = Timeline(_S.settings.timeline, 0, _S.settings.timeline_mark_cycles)
        global_process_set.process_set_id = 0
        _S.sets[0] = global_process_set
        _make_engine(global_process_set)
        for ps in process_sets or ():
            _register(ps)


def _register(ps: ProcessSet) -> ProcessSet:
    if ps.ranks is None:
        raise ValueError("a process set needs its list of ranks")
    bad = [r for r in ps.ranks if not 0 <= r < _un.size()]
    if bad or not ps.ranks:
        raise ValueError(f"process set ranks {ps.ranks} are not ranks of a job of {_un.size()}")
    for other in _S.sets.values():
        if other.ranks is not None and other.ranks == ps.ranks:
            raise ValueError(f"a process set with ranks {ps.ranks} is already registered")
    ps.process_set_id = _S.next_id
    _S.next_id += 1
    _S.sets[ps.process_set_id] = ps
    _make_engine(ps)
    return ps


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; every rank of the job must call this, in the same order."""
    _require()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    with _S.lock:
        return _register(ps)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (every rank calls it); False if it was not registered."""
    _require()
    with _S.lock:
        pid = process_set.process_set_id
        if pid is None or pid == 0 or pid not in _S.sets:
            return False
        del _S.sets[pid]
        eng = _S.engines.pop(pid, None)
        process_set.process_set_id = None
    if eng is not None:
        eng.close()
    return True


def engine_of(ps: ProcessSet) -> HorovodEngine:
    _require()
    pid = ps.process_set_id
    if pid is None or pid not in _S.sets:
        raise ValueError(f"{ps} is not registered: call hvd.add_process_set first")
    eng = _S.engines.get(pid)
    if eng is None:
        raise ValueError(f"rank {_un.rank()} is not a member of {ps}")
    return eng


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered process set with ``process_set_id`` (ValueError if none)."""
    ps = _S.sets.get(process_set_id)
    if ps is None:
        raise ValueError(f"no process set with id {process_set_id}")
    return ps


def shutdown() -> None:
    """Stop the engines (pending operations fail) and leave the job if init() joined it."""
    with _S.lock:
        if _S.settings is None:
            return
        engines = list(_S.engines.values())
        _S.engines.clear()
        for ps in _S.sets.values():
            if ps is not global_process_set:
                ps.process_set_id = None
        _S.sets.clear()
        _S.next_id = 1
        tl, _S.timeline = _S.timeline, None
        _S.settings = None
        owns, _S.owns_runtime = _S.owns_runtime, False
    for eng in engines:
        eng.close()
    if tl is not None:
        tl.close()
    if owns:
        _un.shutdown()
    # generated names (``allreduce.noname.N``) start again at 0: after an elastic reset the
    # survivors and the ranks that join the new world then generate the same names
    from .ops import reset_generated_names

    reset_generated_names()


atexit.register(shutdown)


def is_initialized() -> bool:
    return _S.settings is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline (rank 0 of the job writes it)."""
    _require()
    if _un.rank() != 0:
        return
    with _S.lock:
        if _S.timeline is not None:
            _S.timeline.close()
        _S.timeline = Timeline(file_path, 0, mark_cycles)
        eng = _S.engines.get(0)
        if eng is not None:
            eng.set_timeline(_S.timeline)


def stop_timeline() -> None:
    _require()
    with _S.lock:
        tl, _S.timeline = _S.timeline, None
        eng = _S.engines.get(0)
        if eng is not None:
            eng.set_timeline(None)
    if tl is not None:
        tl.close()


def size() -> int:
    _require()
    return _un.size()


def rank() -> int:
    _require()
    return _un.rank()


def local_size() -> int:
    _require()
    return _un.local_size()


def local_rank() -> int:
    _require()
    return _un.local_rank()


def cross_size() -> int:
    _require()
    return _un.cross_size()


def cross_rank() -> int:
    _require()
    return _un.cross_rank()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    _require()
    counts = _un.all_gather_object(_un.local_size()) if _un.size() > 1 else [1]
    return len(set(counts)) == 1


def _backend() -> str | None:
    """The unison backend this job runs on (None before :func:`init`)."""
    if _S.settings is None or not _un.is_initialized():
        return None
    from ..world import current

    return current().config.backend


def mpi_threads_supported() -> bool:
    """Whether MPI was initialized with MPI_THREAD_MULTIPLE (Horovod: a ValueError when
    MPI is not enabled)."""
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    from mpi4py import MPI

    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def mpi_built() -> bool:
    """True when MPI can be used (mpi4py importable: unison's ``mpi`` backend)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """True when this job's collectives run on MPI (``UNISON_BACKEND=mpi``)."""
    return _backend() == "mpi"


def gloo_built() -> bool:
    """True when Gloo can be used (torch.distributed with Gloo: the ``torch`` backend)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_enabled() -> bool:
    """True when this job's collectives run on Gloo (the ``torch`` backend over a Gloo
    process group)."""
    if _backend() != "torch":
        return False
    import torch.distributed as dist

    return bool(dist.is_initialized() and "gloo" in str(dist.get_backend()))


def nccl_built() -> int:
    """0: the engine moves host memory (Horovod returns the NCCL version, or 0)."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
