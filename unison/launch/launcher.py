"""``unison run -np N [-H host:n,...] command ...``: start a job and supervise it.

The launcher generates a per-job secret and id, serves the job's
:class:`~unison.store.TCPStoreServer` (on 127.0.0.1; on 0.0.0.0, advertised as
``--store-addr``, when ranks run on other hosts — see :mod:`.hosts`), starts N ranks with the
``UNISON_*`` (and Horovod's ``HOROVOD_*``) environment, forwards their output and
watches them. One failure fails the job: the first rank to fail is named with its
exit code or signal and its reason (the :data:`~unison.jobenv.FAILURE_KEY`
record it left in the store, else its last stderr line); the other ranks get
:data:`FAILURE_GRACE` seconds to notice and report it themselves, then SIGTERM, then
SIGKILL. Signals to the launcher reach the ranks (SIGINT as SIGINT, escalated to SIGTERM
and SIGKILL by a repeat or the grace; SIGUSR1/SIGUSR2 forwarded); remote ranks get them
through their wrapper (:mod:`.remote`). Exit status: 0 when
every rank exits 0, else the first failing rank's status (128 + signal when killed),
124 on ``--job-timeout``, 130/143 on SIGINT/SIGTERM, 127 when the command is not
found.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import selectors
import shlex
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import BinaryIO

from .. import config as C
from ..errors import InvalidArgumentError
from ..jobenv import FAILURE_KEY, parse_failure_record
from ..store import TCPStoreServer
from ..transport.shm_segment import cleanup_job
from . import elastic_cli as elastic
from .habits import habit_environment, python_command
from .hosts import (
    DEFAULT_RSH,
    Slot,
    allocate,
    forwarded_environment,
    host_list,
    is_local,
    remote_argv,
    ssh_template,
    store_endpoint,
)
from .options import configure_parser, free_port, parse_exports, resolve_np, stdin_ranks
from .output import OutputForwarder
from .rankenv import cpu_share, rank_environment, thread_notice, thread_share, usable_cpus
from .remote import StdinForwarder
from .supervise import (
    Launch,
    RankProcess,
    become_subreaper,
    describe_exit,
    end_leftovers,
    exit_status,
    signal_name,
    start_rank,
    take_pipes,
)

__all__ = ["JobSupervisor", "configure_parser", "main", "rank_environment", "run_job"]

GRACE_SECONDS = 3.0  # between SIGTERM and SIGKILL
#: a failure reason with one of these is the consequence of another rank's failure
_CONSEQUENCES = (
    "PeerLostError",
    "AbortedError",
    "has shut down",
    "lost connection to rank",
    "was lost",
)
FAILURE_GRACE = 2.0  # after a failure, before the others get SIGTERM (they say why first)
DRAIN_SECONDS = 2.0  # output still read after the last rank exited
EXIT_JOB_TIMEOUT = 124
EXIT_NOT_FOUND, EXIT_CANNOT_RUN = 127, 126


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("unison run: no command given (usage: unison run -np N command ...)", file=sys.stderr)
        return 2
    try:
        habit_env, notes = habit_environment(args)
        command, ran_with = python_command(command)
        for note in [*notes, ran_with]:
            if note:
                print(f"unison run: {note}", file=sys.stderr)
        prefix = C.load_config().prefix_output if args.prefix is None else args.prefix
        hosts = host_list(args.hosts, args.hostfile)
        np = resolve_np(args, hosts) if not elastic.is_elastic(args) or args.np else 0
        if hosts and args.nproc_per_node:
            hosts = [(h, args.nproc_per_node) for h, _ in hosts]
        if hosts and args.nnodes:
            hosts = hosts[: args.nnodes]
        extra_env, export_names = parse_exports(args.export)
        extra_env = {**habit_env, **extra_env}  # -x NAME=VALUE wins over a flag's value
        if elastic.is_elastic(args):
            rsh = ssh_template(args.rsh, args.ssh_port, args.ssh_identity_file)
            env = {**os.environ, **extra_env}
            return elastic.main(args, command, hosts, prefix, env, export_names, rsh)
        return run_job(
            command,
            np,
            timeout=args.timeout,
            job_timeout=args.job_timeout,
            prefix=prefix,
            env={**os.environ, **extra_env},
            servers=args.servers,
            hosts=hosts,
            rsh=ssh_template(args.rsh, args.ssh_port, args.ssh_identity_file),
            store_addr=args.store_addr,
            network_interface=args.network_interface,
            oversubscribe=args.oversubscribe,
            export=export_names,
            stdin_ranks=stdin_ranks(args.stdin, np),
            output_dir=args.output_filename,
            verbose=args.verbose,
            start_timeout=args.start_timeout,
        )
    except InvalidArgumentError as exc:
        print(f"unison run: {exc}", file=sys.stderr)
        return 2


def run_job(
    command: Sequence[str],
    np: int,
    *,
    timeout: float | None = None,
    job_timeout: float | None = None,
    prefix: bool = True,
    env: Mapping[str, str] | None = None,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    servers: int = 0,
    hosts: Sequence[tuple[str, int]] | None = None,
    rsh: str = DEFAULT_RSH,
    store_addr: str | None = None,
    network_interface: str | None = None,
    oversubscribe: bool = False,
    export: Sequence[str] = (),
    stdin_ranks: frozenset[int] = frozenset(),
    output_dir: str | None = None,
    verbose: bool = False,
    start_timeout: float | None = None,
) -> int:
    """Run ``command`` as ``np`` ranks, on this host or over ``hosts`` ((name, slots) in
    order, remote ones started through the ``rsh`` template); the job's exit status."""
    if np < 1:
        raise InvalidArgumentError(f"-np must be >= 1, got {np}")
    if not 0 <= servers < np:
        raise InvalidArgumentError(
            f"--servers must be in 0..{np - 1} (at least one worker), got {servers}"
        )
    for name, value in (
        ("--timeout", timeout),
        ("--job-timeout", job_timeout),
        ("--start-timeout", start_timeout),
    ):
        if value is not None and not value > 0:
            raise InvalidArgumentError(f"{name} must be > 0 seconds, got {value}")
    secret = secrets.token_bytes(32)
    job_id = f"{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
    base = {**(os.environ if env is None else env), C.ENV_PREFIX_OUTPUT: "1" if prefix else "0"}
    slots = (
        allocate(hosts, np, oversubscribe)
        if hosts
        else [Slot(r, "localhost", r, np, 0, 1) for r in range(np)]
    )
    remote = [s.host for s in slots if not is_local(s.host)]
    advertised, bind = "127.0.0.1", ("127.0.0.1", 0)
    if remote or store_addr or network_interface:
        first = remote[0] if remote else None
        advertised, port = store_endpoint(store_addr, network_interface, first)
        bind = ("0.0.0.0", port)  # the job secret guards it; every host must reach it
    master = (advertised if is_local(slots[0].host) else slots[0].host, free_port(bind[0]))
    cpus = usable_cpus()
    crowded = max((s.local_size for s in slots if is_local(s.host)), default=1)
    bound = cpu_share(base, 0, crowded, cpus) is not None
    notice = thread_notice(base, crowded, len(cpus), bound=bound)
    if notice:
        with contextlib.suppress(OSError, ValueError):
            (stderr or sys.stderr.buffer).write(f"unison run: {notice}\n".encode())
    with TCPStoreServer(*bind, secret, max_connections=max(1024, 4 * np)) as server:
        server.start()
        store = (advertised, server.address[1])
        envs = [
            rank_environment(
                base,
                rank=s.rank,
                size=np,
                store=store,
                secret=secret,
                job_id=job_id,
                timeout=timeout,
                servers=servers,
                slot=s,
                network_interface=network_interface,
                master=master,
                cpus=cpus if is_local(s.host) else None,
            )
            for s in slots
        ]
        launches: list[Launch] = []
        # one local reader takes the launcher's stdin as it is; else every reader gets a copy
        copy = len(stdin_ranks) > 1 or any(not is_local(slots[r].host) for r in stdin_ranks)
        for s, e in zip(slots, envs, strict=True):
            if is_local(s.host):
                mode = ("feed" if copy else "inherit") if s.rank in stdin_ranks else None
                launches.append(Launch(list(command), e, mode))
                continue
            header = {
                "argv": list(command),
                "env": forwarded_environment(e, export),
                "cwd": os.getcwd(),
                "host": s.host,
                "store": list(store),
                "start_timeout": start_timeout or 30.0,
                "stdin": s.rank in stdin_ranks,
                # the remote host divides its own cores among its ranks (thread counts)
                "share_cores": thread_share(base, s.local_size),
            }
            launches.append(Launch(remote_argv(rsh, s.host), dict(base), "pipe", header))
        job = JobSupervisor(
            command,
            [la.env for la in launches],
            server,
            job_timeout=job_timeout,
            prefix=prefix,
            stdout=stdout or sys.stdout.buffer,
            stderr=stderr or sys.stderr.buffer,
            argvs=[la.argv for la in launches],
            hosts=[s.host for s in slots] if hosts else None,
            launches=launches,
            output_dir=output_dir,
            verbose=verbose,
        )
        try:
            return job.run()
        finally:
            cleanup_job(job_id)  # shared memory of ranks killed before they unlinked it


class JobSupervisor:
    """The launcher's event loop: rank exits (pidfds), their output, signals, deadlines."""

    def __init__(
        self,
        command: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        server: TCPStoreServer,
        *,
        job_timeout: float | None,
        prefix: bool,
        stdout: BinaryIO,
        stderr: BinaryIO,
        argvs: Sequence[Sequence[str]] | None = None,
        hosts: Sequence[str] | None = None,
        launches: Sequence[Launch] | None = None,
        output_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        self.command = list(command)
        self.argvs = [list(a) for a in argvs] if argvs else [self.command] * len(envs)
        self.hosts = list(hosts) if hosts else None
        self.envs = list(envs)
        self.server = server
        self.job_timeout = job_timeout
        self.stderr = stderr
        self.sel = selectors.DefaultSelector()
        self.output = OutputForwarder(self.sel, stdout, stderr, prefix=prefix, files=output_dir)
        self.launches = list(launches) if launches else None
        self.verbose = verbose
        self.ranks: list[RankProcess] = []
        self.signals: list[int] = []
        self.stop_reason: str | None = None  # "failure", "timeout", "signal"
        self.stop_status = 0
        self.kill_at: float | None = None
        self.stages: list[int] = []  # signals still to send, one per grace period
        self.failed: list[RankProcess] = []  # failures not caused by the launcher
        self.stdin: StdinForwarder | None = None
        self._wake_r, self._wake_w = os.pipe()

    # -- life cycle -------------------------------------------------------------------
    def run(self) -> int:
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        signals = self._install_signals()
        signals.callback(become_subreaper())  # a rank's setsid()'d descendants come to us
        try:
            status = self._start_all()
            if status is None:
                self._forward_stdin()
                self._loop()
                status = self._verdict()
            return status
        finally:
            self._cleanup()
            signals.close()

    def _install_signals(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if threading.current_thread() is not threading.main_thread():
            return stack

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.signals.append(signum)

        old_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        stack.callback(signal.set_wakeup_fd, old_fd)
        for signum in (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGUSR2,
        ):
            old = signal.signal(signum, on_signal)
            stack.callback(signal.signal, signum, old)
        return stack

    def _start_all(self) -> int | None:
        for rank, env in enumerate(self.envs):
            la = self.launches[rank] if self.launches else None
            if self.verbose:
                where = f" on host {self.hosts[rank]}" if self.hosts else ""
                self._say(f"rank {rank}{where}: {shlex.join(self.argvs[rank])}")
            try:
                if la is None:
                    rp = start_rank(rank, self.argvs[rank], env)
                else:
                    rp = start_rank(rank, la.argv, la.env, la.stdin, la.header)
            except OSError as exc:
                self._stop("failure", 0)
                self._finish_kill()
                what = self.argvs[rank][0]
                if isinstance(exc, FileNotFoundError):
                    self._say(f"cannot start {what!r}: command not found")
                    return EXIT_NOT_FOUND
                self._say(f"cannot start {what!r}: {exc.strerror or exc}")
                return EXIT_CANNOT_RUN
            self.ranks.append(rp)
            out_fd, err_fd = take_pipes(rp)
            self.output.add(rank, out_fd, err_fd)
            if rp.pidfd is not None:
                self.sel.register(rp.pidfd, selectors.EVENT_READ, rp)
        return None

    def _forward_stdin(self) -> None:
        """Copy the launcher's stdin to the ranks that read it through a pipe (remote
        ranks, or several readers); the launcher keeps no write end of a local one."""
        targets: list[tuple[int, bool]] = []
        for rp, la in zip(self.ranks, self.launches or (), strict=False):
            if rp.feed is not None:
                targets.append((rp.feed, False))
            elif rp.ctl is not None and la.header and la.header.get("stdin"):
                targets.append((rp.ctl, True))
        if targets:
            self.stdin = StdinForwarder(targets).start()
        for rp in self.ranks:
            if rp.feed is not None:
                os.close(rp.feed)
                rp.feed = None

    def _loop(self) -> None:
        deadline = None if self.job_timeout is None else time.monotonic() + self.job_timeout
        drain_until: float | None = None
        while True:
            now = time.monotonic()
            if not any(r.running for r in self.ranks):
                if drain_until is None:
                    drain_until = now + DRAIN_SECONDS
                if self.output.open_streams == 0 or now >= drain_until:
                    return
            timeouts = [t - now for t in (deadline, self.kill_at, drain_until) if t is not None]
            if any(r.running and r.pidfd is None for r in self.ranks):
                timeouts.append(0.05)  # no pidfd on this kernel: bounded polling
            wait = max(0.0, min(timeouts)) if timeouts else None
            for key, _ in self.sel.select(wait):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                elif isinstance(key.data, RankProcess):
                    with contextlib.suppress(KeyError, ValueError):
                        self.sel.unregister(key.fileobj)
                else:
                    self.output.on_readable(key.data)
            self._reap()
            self._handle_signals()
            now = time.monotonic()
            if deadline is not None and now >= deadline and self.stop_reason is None:
                self._say(f"job timed out after {self.job_timeout:g} s; ending all ranks")
                self._stop("timeout", EXIT_JOB_TIMEOUT)
            if self.kill_at is not None and now >= self.kill_at:
                self._escalate()

    def _reap(self) -> None:
        for rp in self.ranks:
            if rp.poll() and rp.returncode != 0:
                caused_by_us = rp.signalled and rp.returncode in (
                    -signal.SIGTERM,
                    -signal.SIGKILL,
                )
                if self.stop_reason in (None, "failure") and not caused_by_us:
                    self.failed.append(rp)
                if self.stop_reason is None:  # the others get a moment to say why
                    self._stop("failure", 0, [0, signal.SIGTERM, signal.SIGKILL], FAILURE_GRACE)

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum in (signal.SIGUSR1, signal.SIGUSR2):
                self._send(signum)  # forwarded, as mpirun does; the job goes on
                continue
            if self.stop_reason == "signal":
                self._escalate()  # asked twice: the next, harder signal now
                continue
            self._say(f"interrupted by {signal_name(signum)}; ending all ranks")
            first = signal.SIGTERM if signum == signal.SIGHUP else signum
            stages = [first] + [s for s in (signal.SIGTERM, signal.SIGKILL) if s != first]
            self._stop("signal", 128 + signum, stages)

    def _send(self, signum: int) -> None:
        for rp in self.ranks:
            if rp.running:
                rp.signal_group(signum)

    def _stop(
        self, reason: str, status: int, stages: Sequence[int] = (), grace: float = GRACE_SECONDS
    ) -> None:
        """Start ending the job: send each stage's signal (0: none) to every running
        rank, one per grace period (SIGTERM, then SIGKILL by default)."""
        if self.stop_reason is None or reason == "signal":
            self.stop_reason, self.stop_status = reason, status
        if reason == "signal" or not self.stages:
            self.stages = list(stages or (signal.SIGTERM, signal.SIGKILL))
            self._escalate(grace)

    def _escalate(self, grace: float = GRACE_SECONDS) -> None:
        if not self.stages:
            self._finish_kill()
            return
        signum = self.stages.pop(0)
        if signum:
            self._send(signum)
        self.kill_at = time.monotonic() + grace if self.stages else None

    def _finish_kill(self) -> None:
        self.stages = []
        for rp in self.ranks:
            if rp.running:
                rp.signal_group(signal.SIGKILL)
        self.kill_at = None

    # -- verdict ----------------------------------------------------------------------
    def _blame(self) -> tuple[RankProcess, str | None] | None:
        """The root-cause failure: not a rank that only lost a peer (ranks get a moment to
        say why before they are ended), then the earliest recorded, then the first seen."""
        best: tuple[tuple[bool, float, int], RankProcess, str | None] | None = None
        for order, rp in enumerate(self.failed):
            raw = self.server.get_local(FAILURE_KEY.format(rank=rp.rank))
            why, when = parse_failure_record(raw) if raw is not None else (None, None)
            # without a record (an error raised outside the core API: unison.torch, c10d),
            # the rank's last stderr line says whether it only lost a peer; ranks reaped
            # in one pass are in rank order, so a survivor's error may come first
            said = why or self.output.last_stderr_line(rp.rank)
            consequence = bool(said) and any(w in str(said) for w in _CONSEQUENCES)
            key = (consequence, when if when is not None else float("inf"), order)
            if best is None or key < best[0]:
                best = (key, rp, why)
        return None if best is None else (best[1], best[2])

    def _verdict(self) -> int:
        if self.stop_reason in ("timeout", "signal"):
            return self.stop_status
        self.output.close_all()  # every rank's last stderr line is in (see _blame)
        blamed = self._blame()
        if blamed is None:
            if self.stop_reason == "failure":  # only launcher-caused exits: odd, not 0
                return 1
            return 0
        rp, why = blamed
        assert rp.returncode is not None
        why = why or self.output.last_stderr_line(rp.rank)
        where = f" on host {self.hosts[rp.rank]}" if self.hosts else ""
        line = f"rank {rp.rank}{where} failed first ({describe_exit(rp.returncode)})"
        self._say(f"{line}: {why}" if why else line)
        return exit_status(rp.returncode)

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stderr.write(f"unison run: {text}\n".encode())
            self.stderr.flush()

    def _cleanup(self) -> None:
        if self.stdin is not None:
            self.stdin.close()
        for rp in self.ranks:  # nothing survives the job, not even grandchildren
            rp.signal_group(signal.SIGKILL)
        for rp in self.ranks:
            with contextlib.suppress(Exception):
                rp.proc.wait(timeout=5)
            rp.poll()
            rp.close_pidfd()
            rp.close_ctl()
        job = self.envs[0].get(C.ENV_JOB_ID) if self.envs else None
        if job:  # descendants that left their rank's session (setsid) and outlived it
            end_leftovers(f"{C.ENV_JOB_ID}={job}")
        self.output.close_all()
        self.sel.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
