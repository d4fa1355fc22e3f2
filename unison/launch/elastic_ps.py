"""``unison run --servers S`` in elastic mode: parameter servers that outlive their workers.

``unison run -np 6 --servers 2 --min-np 4 --max-np 8 -H a:4,b:4 python train.py``
starts one world of ``-np`` processes (more if slots allow, up to ``--max-np``), the last
``S`` of them servers, as the non-elastic form does; every process gets
``UNISON_PS_ELASTIC=1``. From then on the driver forms no new worlds:

- a worker that fails (exits non-zero or is killed) is not fatal: the servers drop it
  from their clocks, the other workers go on, its host is blacklisted as in any elastic
  job (its other processes keep running: parameter-server workers do not depend on
  each other), and a replacement is started on a free slot with the lost worker's id
  (``UNISON_PS_JOIN=<id>``, ps-lite's recovery rule); it joins the running servers
  (:mod:`unison.ps.join`);
- new slots from ``--host-discovery-script`` start new workers with new ids, up to
  ``--max-np`` processes;
- a server that fails, or a host running one that discovery removes, ends the job:
  the shards exist nowhere else;
- below ``--min-np`` processes the job goes on with fewer workers and fails only if
  no slot comes back within ``--elastic-timeout``; ``--reset-limit`` bounds the
  number of replacements;
- once a worker has finished (exit 0) no replacement is started; the job ends when the
  servers exit (they do once every worker has left), status 0 if they exit 0.

``-np``, ``--min-np`` and ``--max-np`` count every process, servers included, as
``-np`` does in the non-elastic form.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass
from typing import Any

from .. import config as C
from ..elastic import Member, assign, plan
from ..ps.join import cancel_join, claim_ticket
from .elastic import ElasticDriver, _Worker
from .supervise import describe_exit

__all__ = ["PsElasticDriver"]


@dataclass(frozen=True)
class _Role:
    server: bool
    index: int  # server index, or worker id
    ticket: int = 0  # started after the first world: the join it was given (else 0)


class PsElasticDriver(ElasticDriver):
    """Starts, watches and refills the processes of one elastic parameter-server job."""

    def __init__(self, command: Any, *, servers: int, **kwargs: Any) -> None:
        super().__init__(command, **kwargs)
        self.num_servers = servers
        self.env["UNISON_PS_ELASTIC"] = "1"
        self.roles: dict[str, _Role] = {}
        self.free_ids: list[int] = []  # ids of lost workers, replaced lowest first
        self.next_id = 0

    def _role(self, w: _Worker) -> _Role:
        return self.roles[w.member.id]

    def _live_servers(self) -> list[_Worker]:
        return [w for w in self._live() if self._role(w).server]

    # -- starting -----------------------------------------------------------------------
    def _reform(self, reason: str) -> None:
        live = self._live()
        usable = self.blacklist.filter(self.hosts)
        new_hosts = plan([w.member for w in live], usable, self.max_np, self.host_order)
        if self.round < 0:
            self._start_job(new_hosts)
            return
        if self.succeeded or self.failure is not None:
            return
        if self.reset_limit is not None and self.resets + len(new_hosts) > self.reset_limit:
            self._fail(f"reset limit {self.reset_limit} exceeded ({reason})", 1)
            return
        # a host's share of the cores counts the processes it runs once these start
        self.per_host = {}
        for h in [w.member.host for w in live] + new_hosts:
            self.per_host[h] = self.per_host.get(h, 0) + 1
        for host in new_hosts:
            self.resets += 1
            what = "replaces the lost worker" if self.free_ids else "a new worker"
            wid = self.free_ids.pop(0) if self.free_ids else self._new_id()
            m = Member(f"{host}[{len(self.workers)}]", host, rank=wid)
            # claimed before the worker starts: the servers open its world at once, and
            # the driver can cancel their wait if it dies before connecting
            self.roles[m.id] = _Role(False, wid, claim_ticket(self.client, wid))
            if host not in self.host_order:
                self.host_order.append(host)
            self._say(
                f"elastic reset {self.resets}: {reason}; starting worker {wid} on host {host} "
                f"({what}; it joins the running servers)"
            )
            self._start(m, self.num_servers + 1)
        have = len(live) + len(new_hosts)
        if have >= self.min_np:
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since, self.pending_reason = time.monotonic(), reason
            self._say(
                f"{reason}; {have} processes, fewer than --min-np {self.min_np}: the workers "
                f"go on, and the job fails if no slot comes back within "
                f"{self.elastic_timeout:g} s (--elastic-timeout)"
            )
        elif time.monotonic() - self.waiting_since >= self.elastic_timeout:
            self._fail(
                "Timed out waiting for minimum number of slots to become available. "
                f"Please check that you have enough resources to run at least {self.min_np} "
                f"processes (--min-np {self.min_np}; {have} available after "
                f"{self.elastic_timeout:g} s, --elastic-timeout)",
                1,
            )

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _start_job(self, hosts: list[str]) -> None:
        """The first world: servers and workers together, as without elastic flags."""
        if len(hosts) < self.np:
            super()._reform(self.pending_reason)  # waits for -np slots, or fails
            return
        self.waiting_since = None
        fresh = [Member(f"{h}[{i}]", h) for i, h in enumerate(hosts)]
        ranks = assign(fresh)
        size = len(fresh)
        self.round = 0
        workers = size - self.num_servers
        self.next_id = workers
        per: dict[str, int] = {}
        for m in fresh:
            m.rank = ranks[m.id].rank
            server = m.rank >= workers
            self.roles[m.id] = _Role(server, m.rank - workers if server else m.rank)
            per[m.host] = per.get(m.host, 0) + 1
            if m.host not in self.host_order:
                self.host_order.append(m.host)
        self.per_host = per  # each host's cores are shared among its processes
        layout = ", ".join(f"{h}:{n}" for h, n in per.items())
        served = (
            f"1 server (rank {workers})"
            if self.num_servers == 1
            else f"{self.num_servers} servers (ranks {workers}-{size - 1})"
        )
        self._say(
            f"elastic parameter-server job: {workers} workers, {served}; {size} ranks ({layout})"
        )
        for m in sorted(fresh, key=lambda m: m.rank or 0):
            self._start(m, size)

    def _environment(self, m: Member, size: int, servers: int = 0) -> dict[str, str]:
        role = self.roles[m.id]
        if not role.ticket:
            return super()._environment(m, size, self.num_servers)
        # its identity is that of its own world with the servers: rank `servers` of S + 1
        place = Member(m.id, m.host, rank=self.num_servers)
        env = super()._environment(place, self.num_servers + 1, 0)
        env[C.ENV_ROLE] = "worker"
        env[C.ENV_PS_JOIN] = str(role.index)
        env[C.ENV_PS_JOIN_TICKET] = str(role.ticket)
        return env

    # -- exits --------------------------------------------------------------------------
    def _on_exit(self, w: _Worker) -> None:
        rc = w.proc.returncode
        assert rc is not None
        role = self._role(w)
        if role.server:
            if rc != 0 and not w.ended_by_driver and self.failure is None:
                self._fail(
                    f"parameter server {role.index} (rank {w.member.rank}) on host "
                    f"{w.member.host} was lost ({describe_exit(rc)}); the job cannot go on "
                    "without its shards (servers are not replicated)",
                    1,
                )
            elif not self._live_servers():
                self.servers_done()
            return
        if rc == 0:
            self.succeeded = True
            return
        host = w.member.host
        why = f"worker {role.index} on host {host} failed ({describe_exit(rc)})"
        if role.ticket:  # if it died before it connected, the servers stop waiting for it
            with contextlib.suppress(Exception):
                cancel_join(self.client, role.ticket, why)
        if w.ended_by_driver or self.failure is not None or self.succeeded:
            return
        self._blacklist(host, why)
        self.free_ids = sorted({*self.free_ids, role.index})
        self._reform(why)

    def servers_done(self) -> None:
        """Every server has exited: the workers still running have nobody to talk to."""
        self.succeeded = self.failure is None
        for w in self._live():
            w.ended_by_driver = True
            w.proc.signal_group(signal.SIGTERM)

    def _end_workers_on(self, host: str) -> None:
        lost = [w for w in self._live_servers() if w.member.host == host]
        if lost:
            idx = self._role(lost[0]).index
            self._fail(
                f"host {host}, which runs parameter server {idx} (rank {lost[0].member.rank}), "
                "was removed by host discovery; the job cannot go on without its shards",
                1,
            )
            return
        for w in self._live():
            if w.member.host == host:
                w.ended_by_driver = True
                w.proc.signal_group(signal.SIGKILL)
                self.free_ids = sorted({*self.free_ids, self._role(w).index})
