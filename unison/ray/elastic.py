"""``ElasticRayExecutor``: an elastic unison job whose hosts are a Ray cluster's nodes.

The driver side of :mod:`unison.elastic` with Ray as the process starter: Ray's node
membership is the host discovery (slots per node from its CPUs/GPUs), each worker is an
actor pinned to its node, and every world is a round published in the driver's
authenticated store. A function run with :meth:`ElasticRayExecutor.run` uses Horovod's
elastic API (``@hvd.elastic.run``, ``state.commit()``): when a worker's actor dies its
node is blacklisted (for ``cooldown_range`` seconds, else for good), the survivors roll
back to their last commit and re-form the world without it; nodes that appear (or come
back from the blacklist) get new workers, which receive the state from rank 0. Fewer
than ``min_workers`` for ``elastic_timeout`` seconds fails the job.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..elastic import Blacklist, Member, Round, assign, blacklisted, cancel, plan, publish
from ..errors import LaunchError, UnsupportedError
from ..launch.hosts import Slot
from ..launch.rankenv import rank_environment, thread_share
from ..log import get_logger
from ..store import TCPStore, TCPStoreServer
from ..transport.shm_segment import cleanup_job
from .ray_logger import CallbackPump
from .runner import MiniSettings
from .worker import UnisonRayWorker

__all__ = ["ElasticRayExecutor", "ElasticSettings"]

_log = get_logger("ray")
DISCOVERY_INTERVAL = 1.0  # seconds between looks at Ray's node membership
NOTICE_WAIT = 30.0  # seconds the first shared worker may take to say its thread count


@dataclass
class _Worker:
    member: Member
    actor: Any
    ref: Any = None  # the running call
    done: bool = False
    result: Any = None


@dataclass
class ElasticSettings(MiniSettings):
    """Horovod's elastic settings (``ElasticRayExecutor.create_settings``)."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600
    cooldown_range: tuple[float, float] | None = None
    discovery: Any = None  # a HostDiscovery used with override_discovery=False
    num_proc: int = 1


class ElasticRayExecutor:
    """Horovod's elastic Ray executor: ``horovod.ray.ElasticRayExecutor``'s constructor
    (``settings, use_gpu, cpus_per_slot, gpus_per_slot, env_vars, override_discovery``)
    and the keywords of ``RayExecutor(min_workers=..., max_workers=...)``, which override
    the settings."""

    @staticmethod
    def create_settings(
        min_num_proc: int = 1,
        max_num_proc: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float = 600,
        timeout_s: float = 30,
        ssh_identity_file: str | None = None,
        nics: set[str] | None = None,
        min_np: int | None = None,
        max_np: int | None = None,
        **kwargs: Any,
    ) -> ElasticSettings:
        """Horovod's factory (``min_np``/``max_np`` are its deprecated names)."""
        if min_np is not None:
            if min_num_proc == 1:
                min_num_proc = min_np
            warnings.warn(
                "min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2
            )
        if max_np is not None:
            if max_num_proc is None:
                max_num_proc = max_np
            warnings.warn(
                "max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2
            )
        known = {f.name for f in fields(ElasticSettings)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"create_settings() got unexpected keyword arguments {unknown}")
        return ElasticSettings(
            min_num_proc=min_num_proc,
            max_num_proc=max_num_proc,
            reset_limit=reset_limit,
            elastic_timeout=elastic_timeout,
            timeout_s=timeout_s,
            ssh_identity_file=ssh_identity_file,
            nics=nics,
            num_proc=min_num_proc,
            **kwargs,
        )

    def __init__(
        self,
        settings: MiniSettings | None = None,
        use_gpu: bool = False,
        cpus_per_slot: float = 1,
        gpus_per_slot: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        override_discovery: bool = True,
        *,
        min_workers: int | None = None,
        max_workers: int | None = None,
        cpus_per_worker: float | None = None,
        gpus_per_worker: float | None = None,
        reset_limit: int | None = None,
        cooldown_range: Sequence[float] | None = None,
        elastic_timeout: float | None = None,
    ) -> None:
        gpus = gpus_per_worker if gpus_per_worker is not None else gpus_per_slot
        if gpus and not use_gpu:  # Horovod's checks and texts
            raise ValueError(
                "gpus_per_slot is set, but use_gpu is False. "
                "use_gpu must be True if gpus_per_slot is set. "
            )
        gpus = gpus or int(use_gpu)
        if use_gpu and gpus < 1:
            raise ValueError(f"gpus_per_slot must be >= 1: Got {gpus}.")
        s = settings if settings is not None else self.create_settings()

        def pick(given: Any, name: str, default: Any) -> Any:  # keyword, else settings
            return given if given is not None else getattr(s, name, default)

        min_workers = int(pick(min_workers, "min_num_proc", 1))
        max_workers = pick(max_workers, "max_num_proc", None)
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {min_workers} and {max_workers}"
            )
        self.settings = s
        self.settings.elastic = True
        self.min_workers, self.max_workers = min_workers, max_workers
        self.cpus_per_worker = cpus_per_worker if cpus_per_worker is not None else cpus_per_slot
        self.gpus_per_worker = gpus if use_gpu else 0
        self.use_gpu = use_gpu
        self.env_vars = dict(env_vars or {})
        self.discovery = None if override_discovery else getattr(s, "discovery", None)
        self.reset_limit = pick(reset_limit, "reset_limit", None)
        lo_hi = pick(cooldown_range, "cooldown_range", None)
        self.blacklist = Blacklist((float(lo_hi[0]), float(lo_hi[1])) if lo_hi else None)
        self.elastic_timeout = float(pick(elastic_timeout, "elastic_timeout", 600))
        self.workers: list[_Worker] = []
        self.round = -1
        self.resets = 0
        self.log: list[str] = []  # one line per world: why it was formed
        self._server: TCPStoreServer | None = None
        self._client: TCPStore | None = None
        self._fn: Callable[[Any], Any] | None = None
        self._executable: tuple[Any, Any, Any] = (None, None, None)
        self._pump: CallbackPump | None = None
        self._succeeded = False
        self._job_id = ""
        self._pending = ""
        self._told_threads = False
        self._node_ip: dict[str, str] = {}  # Ray node id -> its address (its host)

    # --- membership ---------------------------------------------------------------------
    def _nodes(self) -> dict[str, int]:
        """Alive Ray node id -> worker slots (CPUs, and GPUs with use_gpu; or what
        settings.discovery lists, by node address, with override_discovery=False)."""
        out: dict[str, int] = {}
        alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        for node in alive:
            self._node_ip[str(node["NodeID"])] = str(node["NodeManagerAddress"])
        if self.discovery is not None:
            listed = self.discovery.find_available_hosts_and_slots()
            for node in alive:
                for key in (str(node["NodeID"]), str(node["NodeManagerAddress"])):
                    if key in listed:
                        out[str(node["NodeID"])] = int(listed[key])
            return out
        for node in alive:
            res = node.get("Resources", {})
            slots = int(res.get("CPU", 0) // self.cpus_per_worker)
            if self.use_gpu:
                slots = min(slots, int(res.get("GPU", 0) // self.gpus_per_worker))
            out[str(node["NodeID"])] = slots
        return out

    def _note(self, text: str) -> None:
        """Every world and every loss, with its reason: kept in ``log`` and logged at INFO
        (a handled event: nothing for the user to do)."""
        self.log.append(text)
        _log.info("unison.ray elastic: %s", text)  # handled recovery: INFO

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.actor is not None]

    # --- life cycle ---------------------------------------------------------------------
    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
        extra_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        """Serve the store and form the first world (waits up to elastic_timeout for
        ``min_workers`` slots). Every worker, new ones of later worlds included, creates
        ``executable_cls(*executable_args, **executable_kwargs)`` (what ``execute``'s
        function receives) and gets ``env_vars`` and ``extra_env_vars``."""
        self._executable = (executable_cls, executable_args, executable_kwargs)
        if not ray.is_initialized():
            ray.init()
        self._secret = secrets.token_bytes(32)
        self._job_id = f"ray-elastic-{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
        self._server = TCPStoreServer("0.0.0.0", 0, self._secret).start()
        port = self._server.address[1]
        self._store = (ray.util.get_node_ip_address(), port)  # type: ignore[no-untyped-call]
        self._client = TCPStore("127.0.0.1", port, self._secret, timeout=30.0)
        self._extra = {**self.env_vars, **dict(extra_env_vars or {})}
        deadline = time.monotonic() + self.elastic_timeout
        while not self._reform("start"):
            if time.monotonic() >= deadline:
                self.shutdown()
                raise LaunchError(self._too_few())
            time.sleep(DISCOVERY_INTERVAL)

    def shutdown(self) -> None:
        for w in self.workers:
            if w.actor is not None:
                try:
                    ray.kill(w.actor, no_restart=True)
                except Exception:  # already gone
                    pass
                w.actor = None
        for closable in (self._client, self._server):
            if closable is not None:
                closable.close()
        self._client = self._server = None
        if self._job_id:
            cleanup_job(self._job_id)  # shared memory of workers killed before unlinking it

    def _too_few(self) -> str:
        # Horovod's text, then the numbers
        return (
            "Timed out waiting for minimum number of slots to become available. Please check "
            f"that you have enough resources to run at least {self.min_workers} workers "
            f"(min_workers; {self.elastic_timeout:g} s, elastic_timeout)"
        )

    def _reform(self, reason: str) -> bool:
        """Publish the next round (live workers plus new ones on free slots); False when
        there are fewer than min_workers slots."""
        assert self._client is not None
        live = self._live()
        usable = self.blacklist.filter(self._nodes())
        fresh_hosts = plan([w.member for w in live], usable, self.max_workers)
        if len(live) + len(fresh_hosts) < self.min_workers:
            return False
        if self.round >= 0:
            self.resets += 1
            if self.reset_limit is not None and self.resets > self.reset_limit:
                raise LaunchError(f"unison.ray: reset limit {self.reset_limit} exceeded ({reason})")
        fresh = [Member(f"{h[:8]}[{len(self.workers) + i}]", h) for i, h in enumerate(fresh_hosts)]
        ranks = assign([w.member for w in live] + fresh)
        self.round += 1
        publish(self._client, Round(self.round, reason, ranks))
        if self.round > 0:  # the last world may still be forming, waiting for a lost member
            cancel(self._client, self.round - 1, f"superseded by world {self.round}: {reason}")
        self._note(f"world {self.round}: {len(ranks)} workers ({reason})")
        for w in live:
            w.member.rank = ranks[w.member.id].rank
        # a host's cores are divided among its workers (Ray nodes at one address share it)
        per_host: dict[str, int] = {}
        for a in ranks.values():
            ip = self._node_ip.get(a.host, a.host)
            per_host[ip] = per_host.get(ip, 0) + 1
        for m in fresh:
            m.rank = ranks[m.id].rank
            self._start_worker(m, len(ranks), per_host[self._node_ip.get(m.host, m.host)])
        return True

    def _start_worker(self, m: Member, size: int, on_host: int = 1) -> None:
        assert m.rank is not None
        actor: Any = (
            ray.remote(UnisonRayWorker)
            .options(
                num_cpus=self.cpus_per_worker,
                num_gpus=self.gpus_per_worker,
                scheduling_strategy=NodeAffinitySchedulingStrategy(m.host, soft=False),
            )
            .remote()
        )
        env = rank_environment(
            {},
            rank=m.rank,
            size=size,
            store=self._store,
            secret=self._secret,
            job_id=self._job_id,
            slot=Slot(m.rank, m.host, 0, 1, 0, 1),
        )
        env["UNISON_ELASTIC_ID"] = m.id
        env["UNISON_ELASTIC_TIMEOUT"] = repr(self.elastic_timeout)
        env.update(self._extra)
        # torchrun's habit, as unison run: the host's cores divided among its workers of
        # this world, unless the user set a thread count (see RayExecutor)
        share = thread_share({**os.environ, **self._extra}, on_host)
        told = actor.update_env_vars.remote(env, share)  # ordered before any later call
        if share and not self._told_threads:
            self._told_threads = True
            with contextlib.suppress(Exception):  # a notice: never worth failing the start
                notice = ray.get(told, timeout=NOTICE_WAIT)
                if notice:
                    sys.stderr.write(f"unison.ray: {notice}\n")
        w = _Worker(m, actor)
        self.workers.append(w)
        cls, cls_args, cls_kwargs = self._executable
        if cls is not None:
            actor.start_executable.remote(cls, cls_args, cls_kwargs)
        if self._pump is not None:
            self._pump.attach(actor)
        if self._fn is not None:
            w.ref = actor.execute.remote(self._fn)

    # --- running ------------------------------------------------------------------------
    def run(
        self,
        worker_fn: Callable[..., Any],
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """``worker_fn(*args, **kwargs)`` on every worker until the job ends; the results
        of the workers of the last world, in rank order. Every callback is called on the
        driver with each value rank 0 logs (``unison.ray.ray_logger.log``)."""
        a, kw = list(args or ()), dict(kwargs or {})
        return self.execute(lambda _exe: worker_fn(*a, **kw), callbacks)

    def execute(
        self,
        fn: Callable[[Any], Any],
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """``fn(executable)`` on every worker (new ones too) until the job ends; the
        results of the last world's workers, in rank order."""
        if self._client is None:
            raise LaunchError("ElasticRayExecutor is not started; call start() first")
        with CallbackPump(callbacks) as pump:
            self._pump = pump
            try:
                return self._run(fn)
            finally:
                self._pump = None

    def run_remote(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        raise UnsupportedError(
            "ObjectRefs cannot be returned from Elastic runs as the workers are ephemeral"
        )

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        raise UnsupportedError(
            "Elastic mode does not support execute_single. Please use the execute method instead"
        )

    def _run(self, fn: Callable[[Any], Any]) -> list[Any]:
        self._fn = fn
        self._succeeded = False
        for w in self._live():
            w.done, w.result = False, None
            if self._pump is not None:
                self._pump.attach(w.actor)
            w.ref = w.actor.execute.remote(self._fn)
        waiting_since: float | None = None
        next_look = time.monotonic() + DISCOVERY_INTERVAL
        while True:
            running = {w.ref: w for w in self._live() if not w.done and w.ref is not None}
            if not running:
                break
            ready, _ = ray.wait(list(running), num_returns=1, timeout=DISCOVERY_INTERVAL)
            for ref in ready:
                w = running[ref]
                try:
                    w.result, w.done = ray.get(ref), True
                    self._succeeded = True
                except ray.exceptions.RayActorError:
                    self._lost(w)
                    waiting_since = waiting_since or time.monotonic()
                except Exception as exc:
                    exc.add_note(f"unison.ray: raised by rank {w.member.rank} ({w.member.id})")
                    self.shutdown()
                    raise
            if waiting_since is not None and not self._succeeded:
                if self._reform(self._pending):
                    waiting_since = None
                elif time.monotonic() - waiting_since >= self.elastic_timeout:
                    self.shutdown()
                    raise LaunchError(self._too_few())
            elif time.monotonic() >= next_look and not self._succeeded:
                next_look = time.monotonic() + DISCOVERY_INTERVAL
                usable = self.blacklist.filter(self._nodes())
                if plan([w.member for w in self._live()], usable, self.max_workers):
                    self._reform("new slots on the Ray cluster")
        done = sorted((w for w in self._live() if w.done), key=lambda w: w.member.rank or 0)
        self._fn = None
        return [w.result for w in done]

    def _lost(self, w: _Worker) -> None:
        delay = self.blacklist.add(w.member.host)
        self._pending = (
            f"worker lost: rank {w.member.rank} (worker {w.member.id}): its actor died; "
            + blacklisted(w.member.host[:8], delay)
        )
        self._note(self._pending)
        w.actor = None
