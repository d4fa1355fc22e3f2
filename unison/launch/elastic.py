"""``unison run`` in elastic mode: Horovod Elastic's driver over unison's store.

``unison run -np 4 --min-np 2 --max-np 6 --host-discovery-script ./discover.sh cmd``
(or ``-H a:2,b:2 --min-np 2``) starts a worker per available slot (up to
``--max-np``, at least ``-np`` to begin with), each with a worker id
(``UNISON_ELASTIC_ID``). The membership and rank rules are the driver-independent
ones of :mod:`unison.elastic`; this module is one source of membership (processes
started here or through the remote shell), Ray is another.

- A worker that exits non-zero (or is killed) fails its host: the host is
  blacklisted (``--blacklist-cooldown-range MIN MAX``: for a while), its other
  workers are ended, and a new round is published with the survivors (plus new
  workers on free slots of other hosts). The survivors' collectives fail, they roll
  back to their last commit, join the new round and re-sync from its rank 0.
- The discovery script runs every second: new slots start new workers and publish a
  new round (running workers see ``HostsUpdatedInterrupt`` at their next commit);
  workers on hosts that disappeared are ended.
- Below ``--min-np`` the driver waits up to ``--elastic-timeout`` for slots, then
  fails the job; ``--reset-limit`` bounds the number of re-formed worlds.
- The job ends with status 0 when its workers exit 0; every reset is printed with
  its reason.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ..elastic import (
    Blacklist,
    HostDiscovery,
    Member,
    Round,
    assign,
    blacklisted,
    cancel,
    plan,
    publish,
)
from ..errors import LaunchError
from ..jobenv import usable_cores
from ..store import TCPStore, TCPStoreServer
from .hosts import DEFAULT_RSH, Slot, forwarded_environment, is_local, remote_argv
from .output import OutputForwarder
from .rankenv import rank_environment, thread_environment, thread_notice, thread_share
from .supervise import RankProcess, describe_exit, start_rank, take_pipes

__all__ = ["DISCOVERY_INTERVAL", "ElasticDriver"]

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script (Horovod's)
GRACE = 3.0  # between SIGTERM and SIGKILL when the job ends


@dataclass
class _Worker:
    member: Member
    seq: int
    proc: RankProcess
    ended_by_driver: bool = False
    pidfd: int | None = None  # registered in the selector until the worker exits


class ElasticDriver:
    """Starts, watches and re-forms the workers of one elastic job."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        discovery: HostDiscovery,
        np: int,
        min_np: int,
        max_np: int | None,
        elastic_timeout: float,
        reset_limit: int | None,
        blacklist: Blacklist,
        env: Mapping[str, str],
        store: tuple[str, int],
        server: TCPStoreServer,
        secret: bytes,
        job_id: str,
        rsh: str = DEFAULT_RSH,
        export: Sequence[str] = (),
        prefix: bool = True,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        timeout: float | None = None,
        start_timeout: float | None = None,
        verbose: bool = False,
        network_interface: str | None = None,
        job_timeout: float | None = None,
    ) -> None:
        self.command = list(command)
        self.discovery = discovery
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.blacklist = blacklist
        self.env = dict(env)
        self.store_addr, self.secret, self.job_id = store, secret, job_id
        self.client = TCPStore(store[0], store[1], secret, timeout=30.0)
        self.server = server
        self.rsh, self.export = rsh, list(export)
        self.timeout, self.start_timeout, self.verbose = timeout, start_timeout, verbose
        self.network_interface = network_interface
        self.job_timeout = job_timeout
        self.stderr = stderr or sys.stderr.buffer
        self.sel = selectors.DefaultSelector()
        self.output = OutputForwarder(
            self.sel, stdout or sys.stdout.buffer, self.stderr, prefix=prefix
        )
        self.workers: list[_Worker] = []
        self.hosts: dict[str, int] = {}
        self.host_order: list[str] = []
        #: workers per host in the newest world (a local worker's share of the cores)
        self.per_host: dict[str, int] = {}
        self.told_threads = False
        self.round = -1
        self.resets = 0
        self.waiting_since: float | None = None
        self.pending_reason = ""
        self.succeeded = False
        self.failure: str | None = None
        self.kill_at: float | None = None
        self.signals: list[int] = []
        self.status: int | None = None

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._discover(first=True)
            self.waiting_since = time.monotonic()
            self.pending_reason = "initial world"
            self._reform("initial world")
            self._loop()
            return self._verdict()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self._cleanup()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _loop(self) -> None:
        next_discovery = time.monotonic() + DISCOVERY_INTERVAL
        end = None if self.job_timeout is None else time.monotonic() + self.job_timeout
        while True:
            live = [w for w in self.workers if w.proc.running]
            if not live and (self.waiting_since is None or self.failure is not None):
                self.output.close_all()
                return
            now = time.monotonic()
            wait = [next_discovery - now] + ([self.kill_at - now] if self.kill_at else [])
            for key, _ in self.sel.select(max(0.0, min(wait))):
                if isinstance(key.data, _Worker):
                    continue  # its exit is reaped below
                else:
                    self.output.on_readable(key.data)
            for w in self.workers:
                if w.proc.poll():
                    if w.pidfd is not None:  # poll() closed it: forget it before fds reuse
                        with contextlib.suppress(KeyError, ValueError):
                            self.sel.unregister(w.pidfd)
                        w.pidfd = None
                    self._on_exit(w)
            if self.signals and self.failure is None:
                signum = self.signals.pop()
                self._fail(f"interrupted by signal {signum}; ending all workers", 128 + signum)
            now = time.monotonic()
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_at = None
                for w in self.workers:
                    w.proc.signal_group(signal.SIGKILL)
            if end is not None and now >= end and self.failure is None:
                self._fail(f"job timed out after {self.job_timeout:g} s; ending all workers", 124)
            if now >= next_discovery and self.failure is None:
                next_discovery = now + DISCOVERY_INTERVAL
                self._on_discovery_tick()

    def _on_exit(self, w: _Worker) -> None:
        rc = w.proc.returncode
        assert rc is not None
        if rc == 0:
            self.succeeded = True
            return
        if w.ended_by_driver or self.failure is not None or self.succeeded:
            return
        host = w.member.host
        why = f"rank {w.member.rank} (worker {w.member.id}) on host {host} failed"
        why += f" ({describe_exit(rc)})"
        self._blacklist(host, why)
        self._end_workers_on(host)
        self._reform(why)

    def _blacklist(self, host: str, why: str) -> None:
        """Leave ``host`` out of the next worlds (for good, or for its cool-down), and say
        so as every event is said: what happened, then what the driver does."""
        delay = self.blacklist.add(host)
        self._say(f"worker lost: {why}; {blacklisted(host, delay)}")

    def _on_discovery_tick(self) -> None:
        if self.succeeded:
            return  # the job is finishing: no more worlds
        try:
            self._discover()
        except (LaunchError, ValueError) as exc:
            self._say(f"host discovery failed (retrying): {exc}")
            return
        gone = {w.member.host for w in self._live()} - set(self.hosts)
        for host in sorted(gone):
            self._end_workers_on(host)
        shrunk = self._end_workers_beyond_slots()
        if gone or shrunk:
            why = [f"hosts removed by discovery: {', '.join(sorted(gone))}"] if gone else []
            if shrunk:
                why.append(
                    "slots removed by discovery: "
                    + ", ".join(f"{h} now {self.hosts[h]}" for h in shrunk)
                )
            self._reform("; ".join(why))
            return
        if self.waiting_since is not None:
            self._reform(self.pending_reason)
            return
        usable = self.blacklist.filter(self.hosts)
        if plan([w.member for w in self._live()], usable, self.max_np, self.host_order):
            self._reform("new slots from host discovery")

    def _discover(self, first: bool = False) -> None:
        self.hosts = self.discovery.find_available_hosts_and_slots()

    # -- re-forming the world ---------------------------------------------------------------
    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.proc.running and not w.ended_by_driver]

    def _reform(self, reason: str) -> None:
        """Publish the next round: the live workers plus new ones on free slots."""
        live = self._live()
        usable = self.blacklist.filter(self.hosts)
        new_hosts = plan([w.member for w in live], usable, self.max_np, self.host_order)
        need = self.np if self.round < 0 else self.min_np
        now = time.monotonic()
        if self.round >= 0 and not live:
            self._fail(
                f"{reason}: no worker of the last world is left, unable to broadcast state", 1
            )
            return
        if len(live) + len(new_hosts) < need:
            if self.waiting_since is None:
                self.waiting_since, self.pending_reason = now, reason
                self._say(
                    f"{reason}; waiting up to {self.elastic_timeout:g} s for {need} slots "
                    f"(--min-np), {len(live) + len(new_hosts)} available"
                )
            elif now - self.waiting_since >= self.elastic_timeout:
                self._fail(
                    "Timed out waiting for minimum number of slots to become available. "
                    f"Please check that you have enough resources to run at least {need} "
                    f"processes (--min-np {self.min_np}; {len(live) + len(new_hosts)} "
                    f"available after {self.elastic_timeout:g} s, --elastic-timeout)",
                    1,
                )
            return
        self.waiting_since = None
        if self.round >= 0:
            self.resets += 1
            if self.reset_limit is not None and self.resets > self.reset_limit:
                self._fail(f"reset limit {self.reset_limit} exceeded ({reason})", 1)
                return
        members = [w.member for w in live]
        fresh = [Member(f"{h}[{len(self.workers) + i}]", h) for i, h in enumerate(new_hosts)]
        ranks = assign(members + fresh)
        self.round += 1
        publish(self.client, Round(self.round, reason, ranks))
        if self.round > 0:  # the last world may still be forming, waiting for a lost member
            cancel(self.client, self.round - 1, f"superseded by world {self.round}: {reason}")
        for m in members + fresh:
            m.rank = ranks[m.id].rank
            if m.host not in self.host_order:
                self.host_order.append(m.host)
        for w in live:  # output lines carry the worker's rank in the newest world
            self.output.relabel(w.seq, ranks[w.member.id].rank)
        per = {h: sum(a.host == h for a in ranks.values()) for h in self.host_order}
        self.per_host = per
        layout = ", ".join(f"{h}:{n}" for h, n in per.items() if n)
        what = "elastic job" if self.round == 0 else f"elastic reset {self.resets}"
        self._say(f"{what}: {reason}; world {self.round}: {len(ranks)} ranks ({layout})")
        for m in fresh:
            self._start(m, ranks[m.id].size)

    def _environment(self, m: Member, size: int, servers: int = 0) -> dict[str, str]:
        """A new worker's environment (rank ``m.rank`` of ``size``)."""
        assert m.rank is not None
        env = rank_environment(
            self.env,
            rank=m.rank,
            size=size,
            store=self.store_addr,
            secret=self.secret,
            job_id=self.job_id,
            timeout=self.timeout,
            servers=servers,
            slot=Slot(m.rank, m.host, 0, 1, 0, 1),
            network_interface=self.network_interface,
        )
        env["UNISON_ELASTIC_TIMEOUT"] = repr(float(self.elastic_timeout))
        if not servers:  # parameter-server jobs form no elastic rounds (unison.ps.join)
            env["UNISON_ELASTIC_ID"] = m.id
        return env

    def _start(self, m: Member, size: int) -> None:
        seq = len(self.workers)
        assert m.rank is not None
        env = self._environment(m, size)
        # torchrun's habit: each host's cores divided among its workers in the newest
        # world; a remote host counts its own cores (the wrapper applies the share)
        share = thread_share(self.env, self.per_host.get(m.host, 1))
        if share and is_local(m.host):
            cores = usable_cores()
            env.update(thread_environment(self.env, share, cores))
            notice = thread_notice(self.env, share, cores)
            if notice and not self.told_threads:
                self.told_threads = True
                self._say(notice)
        if self.verbose:
            self._say(f"worker {m.id} on host {m.host}: {' '.join(self.command)}")
        try:
            if is_local(m.host):
                rp = start_rank(seq, self.command, env)
            else:
                header = {
                    "argv": self.command,
                    "env": forwarded_environment(env, self.export),
                    "cwd": os.getcwd(),
                    "host": m.host,
                    "store": list(self.store_addr),
                    "start_timeout": self.start_timeout or 30.0,
                    "share_cores": share,
                }
                rp = start_rank(seq, remote_argv(self.rsh, m.host), self.env, "pipe", header)
        except OSError as exc:
            self._fail(f"cannot start {self.command[0]!r}: {exc.strerror or exc}", 127)
            return
        w = _Worker(m, seq, rp)
        self.workers.append(w)
        out_fd, err_fd = take_pipes(rp)
        self.output.add(seq, out_fd, err_fd)
        self.output.relabel(seq, m.rank)
        if rp.pidfd is not None:
            w.pidfd = rp.pidfd
            self.sel.register(rp.pidfd, selectors.EVENT_READ, w)

    def _end_workers_beyond_slots(self) -> list[str]:
        """End the workers a host no longer has slots for (its newest first, as Horovod
        removes a host's highest local ranks); the hosts that shrank."""
        by_host: dict[str, list[_Worker]] = {}
        for w in self._live():
            by_host.setdefault(w.member.host, []).append(w)
        shrunk = []
        for host, ws in by_host.items():
            slots = self.hosts.get(host)
            if slots is None or len(ws) <= slots:
                continue
            shrunk.append(host)
            for w in sorted(ws, key=lambda w: w.seq)[slots:]:
                w.ended_by_driver = True
                w.proc.signal_group(signal.SIGKILL)
        return sorted(shrunk)

    def _end_workers_on(self, host: str) -> None:
        for w in self._live():
            if w.member.host == host:
                w.ended_by_driver = True
                w.proc.signal_group(signal.SIGKILL)

    # -- the end ------------------------------------------------------------------------
    def _fail(self, text: str, status: int) -> None:
        if self.failure is None:
            self.failure, self.status = text, status
            self._say(text)
            for w in self.workers:
                w.proc.signal_group(signal.SIGTERM)
            self.kill_at = time.monotonic() + GRACE

    def _verdict(self) -> int:
        if self.status is not None:
            return self.status
        return 0 if self.succeeded else 1

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stderr.write(f"unison run: {text}\n".encode())
            self.stderr.flush()

    def _cleanup(self) -> None:
        for w in self.workers:
            w.proc.signal_group(signal.SIGKILL)
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.proc.proc.wait(timeout=5)
            w.proc.poll()
            w.proc.close_pidfd()
            w.proc.close_ctl()
        self.output.close_all()
        self.sel.close()
        self.client.close()
