"""``RayExecutor``: run unison (or Horovod-style ``unison.torch``) functions on Ray actors.

The shape of ``horovod.ray.RayExecutor``::

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 3})   # one result per rank, rank order
    executor.shutdown()

:meth:`RayExecutor.start` places one actor per rank (see :mod:`.placement`), serves the
job's authenticated rendezvous store from the driver and gives each actor the
environment ``unison run`` gives a rank. A worker whose actor dies while a function runs
is reported as :class:`~.errors.RayWorkerLostError` naming its rank; a function that
raises is re-raised as Ray raised it (``RayTaskError``, also an instance of the
original exception class) with a note naming the rank. In both cases the other ranks
get :data:`FAILURE_GRACE` seconds to finish; an executor with a lost or stuck worker is
shut down, so nothing is left running.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from ..errors import (
    AbortedError,
    CollectiveTimeoutError,
    InvalidArgumentError,
    LaunchError,
    PeerLostError,
)
from ..jobenv import FAILURE_KEY, parse_failure_record
from ..launch.rankenv import rank_environment, thread_share
from ..store import TCPStoreServer
from ..transport.shm_segment import cleanup_job
from .errors import RayStartTimeoutError, RayWorkerLostError
from .placement import Layout, Placement
from .ray_logger import CallbackPump

if TYPE_CHECKING:
    from .elastic import ElasticRayExecutor

__all__ = ["FAILURE_GRACE", "MiniSettings", "RayExecutor"]

#: seconds the other ranks get to finish once one rank failed or was lost
FAILURE_GRACE = 5.0
_POLL = 1.0  # seconds between checks while functions run
#: errors a rank gets because another rank failed first
_CONSEQUENCES = (PeerLostError, AbortedError, CollectiveTimeoutError)


@dataclass
class MiniSettings:
    """Horovod's minimal Ray settings (``RayExecutor.create_settings``).

    ``timeout_s`` bounds the start-up: the actors' start, their environment and the
    ``executable_cls`` constructors. ``placement_group_timeout_s`` bounds the wait for
    the placement group. ``nics``: the first one is the interface whose address ranks
    advertise (``UNISON_NETWORK_INTERFACE``). The ssh fields are accepted and unused
    (Ray starts the processes; nothing is started over ssh).
    """

    nics: set[str] | None = None
    verbose: int = 1
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    timeout_s: float = 300
    placement_group_timeout_s: float = 100
    elastic: bool = False


class RayExecutor:
    """One unison job on Ray actors; ``horovod.ray.RayExecutor``'s constructor and methods.

    Use ``num_workers`` (actors packed onto as few nodes as possible) or ``num_hosts`` x
    ``num_workers_per_host``. ``num_servers`` (not in Horovod) makes the last ranks
    ``unison.ps`` servers, as ``unison run --servers``. ``min_workers``/``max_workers``
    (Horovod's elastic form) makes it elastic: see :class:`~.elastic.ElasticRayExecutor`.
    """

    @classmethod
    def create_settings(
        cls,
        timeout_s: float = 30,
        ssh_identity_file: str | None = None,
        ssh_str: str | None = None,
        placement_group_timeout_s: float = 100,
        nics: set[str] | None = None,
    ) -> MiniSettings:
        """Horovod's settings factory (``ssh_str`` is written to ``ssh_identity_file``
        when that file does not exist yet, as Horovod does)."""
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(ssh_str)
        return MiniSettings(
            ssh_identity_file=ssh_identity_file,
            timeout_s=timeout_s,
            placement_group_timeout_s=placement_group_timeout_s,
            nics=nics,
        )

    def __init__(
        self,
        settings: MiniSettings | None = None,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        use_current_placement_group: bool = True,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        cooldown_range: Sequence[int] | None = None,
        elastic_timeout: int = 600,
        override_discovery: bool = True,
        *,
        num_servers: int = 0,
    ) -> None:
        # Horovod's checks and texts
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError(
                "`max_workers` provided without any positive `min_workers`"
                "Elastic workloads require a positive `min_workers`"
            )
        if min_workers and num_workers:
            raise ValueError(
                "Both `min_workers` and `num_workers` provided."
                "Only one of the above is allowed as workloads cannot be elastic and "
                "non-elastic."
            )
        if gpus_per_worker and not use_gpu:
            raise ValueError(
                "gpus_per_worker is set, but use_gpu is False. "
                "use_gpu must be True if gpus_per_worker is set. "
            )
        if use_gpu and isinstance(gpus_per_worker, int) and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be >= 1: Got {gpus_per_worker}.")
        self._placement: Placement | None = None
        self._server: TCPStoreServer | None = None
        self._job_id = ""
        self._closed_reason: str | None = None
        self._elastic: ElasticRayExecutor | None = None
        if min_workers is not None:  # the elastic form: Ray's nodes are the host discovery
            from .elastic import ElasticRayExecutor

            self.settings = settings if settings is not None else self.create_settings()
            self._elastic = ElasticRayExecutor(
                self.settings,
                use_gpu,
                override_discovery=override_discovery,
                min_workers=min_workers,
                max_workers=max_workers,
                cpus_per_worker=cpus_per_worker,
                gpus_per_worker=gpus_per_worker,
                reset_limit=reset_limit,
                cooldown_range=cooldown_range,
                elastic_timeout=elastic_timeout,
            )
            self.num_workers, self.num_servers = min_workers, 0
            self.cpus_per_worker, self.use_gpu = cpus_per_worker, use_gpu
            return
        if num_workers is None and not num_hosts:
            raise InvalidArgumentError("RayExecutor needs num_workers, or num_hosts")
        if num_workers is not None and num_workers < 1:
            raise InvalidArgumentError(f"num_workers must be >= 1, got {num_workers}")
        if num_workers_per_host < 1:
            raise InvalidArgumentError(
                f"num_workers_per_host must be >= 1, got {num_workers_per_host}"
            )
        size = num_workers if num_workers else int(num_hosts or 0) * num_workers_per_host
        if not 0 <= num_servers < size:
            raise InvalidArgumentError(
                f"num_servers must be in 0..{size - 1} (at least one worker), got {num_servers}"
            )
        self.num_servers = num_servers
        self.settings = settings if settings is not None else self.create_settings()
        self.settings.elastic = False
        self.layout = Layout(
            num_workers=num_workers,
            num_hosts=None if num_workers else num_hosts,
            num_workers_per_host=num_workers_per_host,
            cpus_per_worker=cpus_per_worker,
            gpus_per_worker=(gpus_per_worker or 1) if use_gpu else 0,
            use_current_placement_group=use_current_placement_group,
        )
        self.num_workers = self.layout.size
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = self.layout.gpus_per_worker

    # --- life cycle -------------------------------------------------------------------
    @property
    def workers(self) -> list[Any]:
        """The worker actors (``UnisonRayWorker`` handles) in rank order."""
        return list(self._placement.actors) if self._placement else []

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
        extra_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        """Place the actors, serve the store, set every rank's environment, then create
        ``executable_cls(*executable_args, **executable_kwargs)`` in each actor."""
        if self._elastic is not None:
            self._elastic.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
            return
        if self._placement is not None:
            raise LaunchError("RayExecutor.start() called twice; call shutdown() first")
        if not ray.is_initialized():
            ray.init()
        s = self.settings
        self._placement = place = Placement.create(
            self.layout, float(s.placement_group_timeout_s), float(s.timeout_s)
        )
        self._closed_reason = None
        try:
            self._serve_and_configure(dict(extra_env_vars or {}))
            self._wait(
                [
                    a.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                    for a in place.actors
                ],
                "start_executable",
            )
        except BaseException:
            self.shutdown()
            raise

    def _serve_and_configure(self, extra: dict[str, str]) -> None:
        place = self._placement
        assert place is not None
        size = len(place.actors)
        driver_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        local = all(ip == driver_ip for ip in place.ips)
        secret = secrets.token_bytes(32)
        self._job_id = f"ray-{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
        bind = "127.0.0.1" if local else "0.0.0.0"
        self._server = TCPStoreServer(bind, 0, secret, max_connections=max(1024, 4 * size))
        self._server.start()
        store = ("127.0.0.1" if local else driver_ip, self._server.address[1])
        master_port = self._wait([place.actors[0].free_port.remote()], "free_port")[0]
        nic = sorted(self.settings.nics)[0] if self.settings.nics else None
        envs = [
            rank_environment(
                {},
                rank=r,
                size=size,
                store=store,
                secret=secret,
                job_id=self._job_id,
                slot=place.slots[r],
                network_interface=nic,
                master=(place.ips[0], int(master_port)),
                servers=self.num_servers,
            )
            for r in range(size)
        ]
        if self.use_gpu:
            gpus = self._wait([a.gpu_ids.remote() for a in place.actors], "gpu_ids")
            per_node: dict[int, list[str]] = {}
            for r, ids in enumerate(gpus):
                per_node.setdefault(place.slots[r].cross_rank, []).extend(ids)
            for r, env in enumerate(envs):
                env["CUDA_VISIBLE_DEVICES"] = ",".join(per_node[place.slots[r].cross_rank])
        for env in envs:
            env.update(extra)
        # torchrun's habit, as unison run: each host's cores divided among its ranks
        # (Ray nodes at one address share a host), unless the user set a thread count (in
        # this process's environment, which a local cluster's workers inherit, or in the
        # variables given to the workers)
        chosen = {**os.environ, **extra}
        on_host = {ip: place.ips.count(ip) for ip in place.ips}
        notices = self._wait(
            [
                a.update_env_vars.remote(e, thread_share(chosen, on_host[place.ips[r]]))
                for r, (a, e) in enumerate(zip(place.actors, envs, strict=True))
            ],
            "update_env_vars",
        )
        said = next((n for n in notices if n), None)
        if said:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"unison.ray: {said}\n")

    def shutdown(self) -> None:
        """Kill the actors, remove the placement group, stop the store."""
        if self._elastic is not None:
            self._elastic.shutdown()
        place, self._placement = self._placement, None
        if place is not None:
            place.release()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._job_id:
            cleanup_job(self._job_id)  # shared memory of ranks killed before unlinking it

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- running ------------------------------------------------------------------------
    def execute(
        self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """``fn(executable)`` on every worker; the results in rank order. Each callback
        is called on the driver with every value rank 0 logs (:mod:`.ray_logger`)."""
        if self._elastic is not None:
            return self._elastic.execute(fn, callbacks=callbacks)
        return self._with_callbacks(
            lambda: [a.execute.remote(fn) for a in self._actors()], callbacks
        )

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        callbacks: Sequence[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order (elastic: of
        the last world's workers). Each callback is called on the driver with every value
        rank 0 logs (:mod:`.ray_logger`)."""
        if self._elastic is not None:
            return self._elastic.run(fn, callbacks, args=args, kwargs=kwargs)
        return self._with_callbacks(lambda: self.run_remote(fn, args, kwargs), callbacks)

    def run_remote(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Start ``fn(*args, **kwargs)`` on every worker; the ``ObjectRef`` s, rank order
        (``ray.get`` them yourself: no failure supervision on this path)."""
        if self._elastic is not None:
            return self._elastic.run_remote(fn)
        a, kw = list(args or ()), dict(kwargs or {})
        return [w.execute.remote(lambda _exe: fn(*a, **kw)) for w in self._actors()]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on the rank 0 worker only; its result."""
        if self._elastic is not None:
            return self._elastic.execute_single(fn)
        return self._gather([self._actors()[0].execute.remote(fn)])[0]

    # --- internals ----------------------------------------------------------------------
    def _with_callbacks(
        self, start: Callable[[], list[Any]], callbacks: Sequence[Callable[..., Any]] | None
    ) -> list[Any]:
        with CallbackPump(callbacks) as pump:
            if pump.queue is not None:
                self._wait([pump.attach(a) for a in self._actors()], "set_queue")
            return self._gather(start())

    def _actors(self) -> list[Any]:
        if self._placement is None:
            raise LaunchError(
                self._closed_reason or "RayExecutor is not started; call start() first"
            )
        return self._placement.actors

    def _wait(self, refs: list[Any], what: str) -> list[Any]:
        """Start-up calls: bounded by settings.timeout_s, a lost actor named."""
        deadline = time.monotonic() + float(self.settings.timeout_s)
        try:
            return self._gather(refs, deadline=deadline)
        except TimeoutError as exc:
            raise RayStartTimeoutError(
                f"unison.ray: {what} did not finish on every worker within "
                f"{self.settings.timeout_s:g} s (settings.timeout_s)"
            ) from exc

    def _gather(self, refs: list[Any], deadline: float | None = None) -> list[Any]:
        """Every ref's value, in order; on a failure the others get FAILURE_GRACE."""
        index = {ref: r for r, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        lost: dict[int, BaseException] = {}
        failed: dict[int, BaseException] = {}
        pending, failed_at = list(refs), None
        while pending:
            now = time.monotonic()
            ends = [t for t in (deadline, failed_at and failed_at + FAILURE_GRACE) if t]
            if ends and now >= min(ends):
                break
            wait_s = min([_POLL, *(t - now for t in ends)])
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
            for ref in ready:
                rank = index[ref]
                try:
                    results[rank] = ray.get(ref, timeout=_POLL)
                except ray.exceptions.RayActorError as died:
                    lost[rank] = died
                except Exception as raised:
                    failed[rank] = raised
                if (lost or failed) and failed_at is None:
                    failed_at = time.monotonic()
        if lost:
            raise self._lost_error(lost, failed, pending, index)
        if failed:
            rank, first = _root_cause(failed)
            first.add_note(f"unison.ray: raised by rank {rank} of {self.num_workers}")
            if pending:
                stuck = _ranks(pending, index)
                self._close(f"RayExecutor was shut down: rank {rank} failed, ranks {stuck} hung")
                first.add_note(f"unison.ray: ranks {stuck} did not finish; executor shut down")
            raise first
        if pending:
            self._close("a call ran past its deadline")
            raise TimeoutError(f"ranks {_ranks(pending, index)} did not answer in time")
        return results

    def _lost_error(
        self,
        lost: dict[int, BaseException],
        failed: dict[int, BaseException],
        pending: list[Any],
        index: Mapping[Any, int],
    ) -> RayWorkerLostError:
        rank = min(lost)
        cause = lost[rank]
        reason = ""
        if self._server is not None:
            raw = self._server.get_local(FAILURE_KEY.format(rank=rank))
            if raw:
                reason = f"; its last recorded error: {parse_failure_record(raw)[0]}"
        detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        others = f"; ranks {sorted(failed)} failed after it" if failed else ""
        stuck = f"; ranks {_ranks(pending, index)} were still running" if pending else ""
        ranks = "ranks " + ", ".join(map(str, sorted(lost))) if len(lost) > 1 else f"rank {rank}"
        message = (
            f"unison.ray: {ranks} of {self.num_workers} lost: the worker actor died "
            f"({detail}){reason}{others}{stuck}; the executor was shut down"
        )
        self._close(f"RayExecutor was shut down after rank {rank} was lost; call start() again")
        actor_id = getattr(cause, "actor_id", None)
        err = RayWorkerLostError(
            message, rank=rank, size=self.num_workers, ranks=lost, actor_id=actor_id
        )
        err.__cause__ = cause
        return err

    def _close(self, reason: str) -> None:
        self.shutdown()
        self._closed_reason = reason


def _root_cause(failed: Mapping[int, BaseException]) -> tuple[int, BaseException]:
    """The failure that is not a consequence of another rank's (else the lowest rank)."""
    for rank in sorted(failed):
        if not isinstance(getattr(failed[rank], "cause", failed[rank]), _CONSEQUENCES):
            return rank, failed[rank]
    rank = min(failed)
    return rank, failed[rank]


def _ranks(pending: Sequence[Any], index: Mapping[Any, int]) -> list[int]:
    return sorted(index[ref] for ref in pending)
