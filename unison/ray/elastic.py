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

import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..elastic import Blacklist, Member, Round, assign, plan, publish
from ..errors import LaunchError
from ..launch.hosts import Slot
from ..launch.rankenv import rank_environment
from ..store import TCPStore, TCPStoreServer
from ..transport.shm_segment import cleanup_job
from .runner import MiniSettings, RayExecutor
from .worker import UnisonRayWorker

__all__ = ["ElasticRayExecutor"]

DISCOVERY_INTERVAL = 1.0  # seconds between looks at Ray's node membership


@dataclass
class _Worker:
    member: Member
    actor: Any
    ref: Any = None  # the running call
    done: bool = False
    result: Any = None


class ElasticRayExecutor:
    """Horovod's elastic Ray executor (``RayExecutor(min_workers=..., max_workers=...)``)."""

    def __init__(
        self,
        settings: MiniSettings | None = None,
        min_workers: int = 1,
        max_workers: int | None = None,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        reset_limit: int | None = None,
        cooldown_range: Sequence[float] | None = None,
        elastic_timeout: float = 600,
    ) -> None:
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {min_workers} and {max_workers}"
            )
        self.settings = settings if settings is not None else RayExecutor.create_settings()
        self.settings.elastic = True
        self.min_workers, self.max_workers = min_workers, max_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_gpu = use_gpu
        self.reset_limit = reset_limit
        lo_hi = tuple(cooldown_range) if cooldown_range else None
        self.blacklist = Blacklist((float(lo_hi[0]), float(lo_hi[1])) if lo_hi else None)
        self.elastic_timeout = float(elastic_timeout)
        self.workers: list[_Worker] = []
        self.round = -1
        self.resets = 0
        self.log: list[str] = []  # one line per world: why it was formed
        self._server: TCPStoreServer | None = None
        self._client: TCPStore | None = None
        self._fn: Callable[[Any], Any] | None = None
        self._succeeded = False
        self._job_id = ""
        self._pending = ""

    # --- membership ---------------------------------------------------------------------
    def _nodes(self) -> dict[str, int]:
        """Alive Ray node id -> worker slots (CPUs, and GPUs with use_gpu)."""
        out: dict[str, int] = {}
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            slots = int(res.get("CPU", 0) // self.cpus_per_worker)
            if self.use_gpu:
                slots = min(slots, int(res.get("GPU", 0) // self.gpus_per_worker))
            out[str(node["NodeID"])] = slots
        return out

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.actor is not None]

    # --- life cycle ---------------------------------------------------------------------
    def start(self, extra_env_vars: Mapping[str, str] | None = None) -> None:
        """Serve the store and form the first world (waits up to elastic_timeout for
        ``min_workers`` slots)."""
        if not ray.is_initialized():
            ray.init()
        self._secret = secrets.token_bytes(32)
        self._job_id = f"ray-elastic-{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
        self._server = TCPStoreServer("0.0.0.0", 0, self._secret).start()
        port = self._server.address[1]
        self._store = (ray.util.get_node_ip_address(), port)  # type: ignore[no-untyped-call]
        self._client = TCPStore("127.0.0.1", port, self._secret, timeout=30.0)
        self._extra = dict(extra_env_vars or {})
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
        self.log.append(f"world {self.round}: {len(ranks)} workers ({reason})")
        for w in live:
            w.member.rank = ranks[w.member.id].rank
        for m in fresh:
            m.rank = ranks[m.id].rank
            self._start_worker(m, len(ranks))
        return True

    def _start_worker(self, m: Member, size: int) -> None:
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
        actor.update_env_vars.remote(env)  # ordered before any later call on this actor
        w = _Worker(m, actor)
        self.workers.append(w)
        if self._fn is not None:
            w.ref = actor.execute.remote(self._fn)

    # --- running ------------------------------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker until the job ends; the results of the
        workers of the last world, in rank order."""
        if self._client is None:
            raise LaunchError("ElasticRayExecutor is not started; call start() first")
        a, kw = list(args or ()), dict(kwargs or {})
        self._fn = lambda _exe: fn(*a, **kw)
        for w in self._live():
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
        how = "for good" if delay is None else f"for {delay:g} s"
        self._pending = (
            f"rank {w.member.rank} (worker {w.member.id}) lost: its actor died; node "
            f"{w.member.host[:8]} blacklisted {how}"
        )
        self.log.append(self._pending)
        w.actor = None
