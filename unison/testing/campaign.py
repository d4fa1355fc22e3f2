"""The fault campaign: what goes wrong, on every entry point and engine, and what is left.

Each case starts a real job (``unison run``, or ``mpirun`` for the mpi engine), makes one
rank fail (killed, stopped, exited, a mismatched call) or attacks a listener, and checks
the promise: every surviving rank gets a typed error naming the operation and the lost
rank, quickly, and nothing is left behind (processes carrying the job, ``/dev/shm``
segments, listening sockets). On the mpi engine a dead process ends the whole job
(OpenMPI's rule): there the promise is mpirun's nonzero exit naming the rank, with
nothing left. One line per case::

    case                    result  time-to-error  leftovers
    native-kill             ok      0.12 s         none

The exit status is non-zero when a case fails. ``--quick`` runs the short part that
``make test`` runs; ``make faults`` runs all of it::

    python -m unison.testing.campaign [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..transport.shm_segment import segment_prefix

__all__ = ["CASES", "Case", "main", "run_case"]

VICTIM = 1  # the rank that fails in every case
NP = 3


# --- what the ranks run (python -m unison.testing.campaign --rank CASE) --------------------
def _report(what: str, exc: BaseException | None, t0: float) -> None:
    rank = int(os.environ.get("UNISON_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or -1)
    rec = {"rank": rank, "what": what, "at": time.time(), "since": time.monotonic() - t0}
    if exc is not None:
        rec.update(type=type(exc).__name__, message=str(exc)[:500], op=getattr(exc, "op", None))
    with open(Path(os.environ["CAMPAIGN_DIR"]) / f"rank{rank}.json", "w") as f:
        json.dump(rec, f)


def _mark_fault() -> None:
    (Path(os.environ["CAMPAIGN_DIR"]) / "fault").write_text(repr(time.time()))


def _fault(kind: str) -> None:
    """Rank VICTIM fails as ``kind`` says (the time is written first)."""
    _mark_fault()
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":  # stopped for 8 s (past the 5 s deadline), then it goes on
        from .faults import stop_process

        stop_process(os.getpid(), 8.0)
    elif kind == "exit":
        os._exit(0)


def _rank_core(kind: str, backend: str | None) -> None:
    import numpy as np

    import unison as un

    un.init(backend=backend)
    r, p = un.rank(), un.size()
    t0 = time.monotonic()
    try:
        if kind == "mismatch":
            un.gather(np.ones(64, np.float32), [np.empty(64, np.float32) for _ in range(p)], dst=r)
        elif kind == "mismatch-dtype":
            un.all_reduce(np.ones(64, np.float32 if r != VICTIM else np.float64))
        elif kind == "reduce-scatter":
            n = 257
            ins = [
                np.random.default_rng(r * 100 + j).standard_normal(n).astype(np.float32)
                for j in range(p)
            ]
            out = np.empty(n, np.float32)
            un.reduce_scatter(out, ins)
            want = sum(
                np.random.default_rng(q * 100 + r).standard_normal(n).astype(np.float32)
                for q in range(p)
            )
            if not np.allclose(out, want, rtol=1e-5, atol=1e-5):
                raise AssertionError(f"reduce_scatter wrong on rank {r}")
            _report("ok", None, t0)
            return
        else:
            x = np.ones(1 << 16, np.float32)
            for step in range(400):
                if step == 20 and r == VICTIM:
                    _fault(kind)
                un.all_reduce(x)
                x[:] = 1.0
        _report("no error", None, t0)
    except Exception as exc:
        _report("error", exc, t0)
    finally:
        un.shutdown()


def _rank_hvd(kind: str) -> None:
    import torch

    import unison.torch as hvd

    hvd.init()
    r = hvd.rank()
    t0 = time.monotonic()
    try:
        x = torch.ones(1 << 16)
        for step in range(400):
            if step == 20 and r == VICTIM:
                _fault(kind)
            hvd.allreduce(x, name="x")
        _report("no error", None, t0)
    except Exception as exc:
        _report("error", exc, t0)
    finally:
        hvd.shutdown()


def _rank_ddp(kind: str) -> None:
    import torch
    import torch.distributed as dist

    import unison.torch.distributed  # noqa: F401  (registers the "unison" backend)

    dist.init_process_group("unison")
    r = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.monotonic()
    try:
        for step in range(400):
            if step == 10 and r == VICTIM:
                _fault(kind)
            opt.zero_grad()
            model(torch.randn(16, 64)).sum().backward()
            opt.step()
        _report("no error", None, t0)
    except Exception as exc:
        _report("error", exc, t0)
    finally:
        dist.destroy_process_group()


def _rank(case: str) -> None:
    entry, _, kind = case.partition(":")
    if entry == "native":
        _rank_core(kind, None)
    elif entry in ("torch", "mpi"):
        _rank_core(kind, entry)
    elif entry == "hvd":
        _rank_hvd(kind)
    elif entry == "ddp":
        _rank_ddp(kind)
    else:
        raise SystemExit(f"unknown rank case {case!r}")


# --- leftovers ----------------------------------------------------------------------------
def _job_processes(job: str) -> list[int]:
    want, out = f"CAMPAIGN_JOB={job}".encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("unison-")}
    except OSError:
        return set()


def _listening() -> set[str]:
    """Local addresses of listening TCP sockets (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":  # LISTEN
                found.add(parts[1])
    return found


# --- the cases ----------------------------------------------------------------------------
@dataclass
class Outcome:
    ok: bool
    detail: str
    time_to_error: float | None = None
    leftovers: list[str] = field(default_factory=list)


@dataclass
class Case:
    name: str
    run: Callable[[], Outcome]
    quick: bool = False
    #: a promise not kept yet, with the reason: reported (KNOWN, or FIXED once it holds),
    #: not counted as a regression
    known: str = ""


def _launch_cmd(case: str, np_: int, engine: str) -> list[str]:
    me = [sys.executable, "-m", "unison.testing.campaign", "--rank", case]
    if engine == "mpi":
        mpirun = Path(sys.executable).parent / "mpirun"
        cmd = [str(mpirun) if mpirun.exists() else "mpirun", "-np", str(np_), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return [
            *cmd, "-x", "CAMPAIGN_DIR", "-x", "CAMPAIGN_JOB", "-x", "UNISON_TIMEOUT",
            "-x", "UNISON_JOB_ID", *me,
        ]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "unison.launch.cli",
        "run",
        "-np",
        str(np_),
        "--timeout",
        "5",
        *me,
    ]


@dataclass
class _Job:
    """One case's job, ended: its process (None: it hung past 120 s), the folder its
    ranks reported into, its id, what existed before it (segments, listeners), and what
    names its segments: the job id ``unison run`` gives its ranks holds the launcher's
    pid; under mpirun the ranks take the campaign's own job id."""

    proc: subprocess.CompletedProcess[str] | None
    tmp: Path
    job: str
    seg0: set[str]
    ports0: set[str]
    ended: float
    marks: tuple[str, ...]

    def leftovers(self) -> list[str]:
        return _leftovers(self.job, self.seg0, self.ports0, self.marks)


def _run_job(case: str, engine: str) -> _Job:
    """Run ``case`` on NP ranks (``unison run``, or mpirun for the mpi engine)."""
    tmp = Path(tempfile.mkdtemp(prefix="unison-campaign-"))
    job = os.urandom(6).hex()
    env = dict(
        os.environ,
        CAMPAIGN_DIR=str(tmp),
        CAMPAIGN_JOB=job,
        UNISON_TIMEOUT="5",
        UNISON_JOB_ID=f"campaign-{job}",  # the ranks' under mpirun; unison run sets its own
    )
    seg0, ports0 = _segments(), _listening()
    marks = [segment_prefix(env["UNISON_JOB_ID"])]
    proc: subprocess.CompletedProcess[str] | None
    with subprocess.Popen(
        _launch_cmd(case, NP, engine),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as launched:
        marks.append(f"-{launched.pid}-")
        try:
            out, err = launched.communicate(timeout=120)
            proc = subprocess.CompletedProcess(launched.args, launched.returncode, out, err)
        except subprocess.TimeoutExpired:
            launched.kill()
            launched.communicate()
            shutil.rmtree(tmp, ignore_errors=True)
            proc = None
    return _Job(proc, tmp, job, seg0, ports0, time.time(), tuple(marks))


def _job_case(case: str, expect: str, *, engine: str = "unison", deadline: float = 4.0) -> Outcome:
    """Run ``case`` on NP ranks; ``expect``: the error type every survivor must raise
    ("any": any error naming the victim; "ok": no error on any rank)."""
    run = _run_job(case, engine)
    proc, tmp = run.proc, run.tmp
    if proc is None:
        return Outcome(False, "the job hung past 120 s", leftovers=run.leftovers())
    try:
        recs = {}
        for f in tmp.glob("rank*.json"):
            rec = json.loads(f.read_text())
            recs[int(rec["rank"])] = rec
        fault = tmp / "fault"
        fault_at = float(fault.read_text()) if fault.exists() else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    left = run.leftovers()
    victim_fails = expect not in ("ok", "mismatch")
    survivors = [r for r in range(NP) if not (victim_fails and r == VICTIM)]
    problems, waits = [], []
    for r in survivors:
        rec = recs.get(r)
        if rec is None:
            problems.append(f"rank {r} reported nothing")
            continue
        if expect == "ok":
            if rec["what"] != "ok":
                problems.append(f"rank {r}: {rec.get('type')}: {rec.get('message')}")
            continue
        if rec["what"] != "error":
            problems.append(f"rank {r} got no error")
            continue
        typ, msg = rec.get("type", ""), rec.get("message", "")
        if expect == "mismatch":
            if "Mismatch" not in typ:
                problems.append(f"rank {r}: {typ}, not a mismatch error: {msg[:120]}")
            waits.append(float(rec["since"]))
            continue
        if expect != "any" and expect not in typ:
            problems.append(f"rank {r}: {typ}, not {expect}: {msg[:120]}")
        if f"rank {VICTIM}" not in msg:
            problems.append(f"rank {r}'s error does not name rank {VICTIM}: {msg[:160]}")
        if fault_at is not None:
            waits.append(float(rec["at"]) - fault_at)
    tte = max(waits) if waits else None
    if tte is not None and tte > deadline:
        problems.append(f"the error came after {tte:.1f} s (promised within {deadline:g} s)")
    if left:
        problems.append("leftovers")
    if problems and proc.returncode != 0 and not recs:
        problems.append(proc.stderr.strip().splitlines()[-1:][0] if proc.stderr.strip() else "")
    return Outcome(not problems, "; ".join(problems) or "every rank as promised", tte, left)


def _leftovers(job: str, seg0: set[str], ports0: set[str], marks: Sequence[str]) -> list[str]:
    """What the job left: its processes, its segments (by ``marks``: other jobs of the
    host may run meanwhile), and listening ports while a process of it lives."""
    end = time.monotonic() + 5
    while True:
        segs = sorted(s for s in _segments() - seg0 if any(m in s for m in marks))
        procs = _job_processes(job)
        ports = sorted(_listening() - ports0)
        if not (procs or segs) or time.monotonic() > end:
            break
        time.sleep(0.2)
    out = [f"process {p}" for p in procs] + [f"segment {s}" for s in segs]
    # a port opened meanwhile by someone else is not ours: report only with our processes
    if procs:
        out += [f"port {p}" for p in ports]
    for p in procs:  # do not leave them to the next case
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return out


_RSS_SERVER = (
    "import sys\n"
    "from unison.store import TCPStoreServer\n"
    "srv = TCPStoreServer(secret=b'campaign-secret', frame_timeout=30.0).start()\n"
    "print(srv.address[1], flush=True)\n"
    "sys.stdin.read()\n"
)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _store_strangers() -> Outcome:
    """48 strangers announce a huge first frame and send 2 MiB each: the store must stay
    within a few MB and keep serving."""
    from ..store import TCPStore

    proc = subprocess.Popen(
        [sys.executable, "-c", _RSS_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.3)
        before, t0 = _rss_kib(proc.pid), time.monotonic()
        junk = b"\0" * (256 << 10)
        for _ in range(48):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(s)
            try:
                s.recv(40)
                s.sendall((16 << 20).to_bytes(4, "big") + b"\0" * 32)
                for _ in range(8):
                    s.sendall(junk)
            except OSError:
                pass
        time.sleep(0.5)
        grown = (_rss_kib(proc.pid) - before) / 1024
        with TCPStore("127.0.0.1", port, b"campaign-secret", timeout=5) as c:
            c.set("k", b"v")
            served = c.get("k") == b"v"
        took = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()
    ok = grown < 8 and served
    return Outcome(ok, f"store grew {grown:.1f} MB under 48 strangers", took)


def _store_junk() -> Outcome:
    """Strangers with junk, wrong secrets and a slow drip: each dropped, the store serves."""
    from ..errors import AuthenticationError
    from ..store import TCPStore, TCPStoreServer

    srv = TCPStoreServer(secret=b"campaign", frame_timeout=1.0).start()
    try:
        host, port = srv.address
        t0 = time.monotonic()
        for payload in (os.urandom(4096), b"GET / HTTP/1.0\r\n\r\n", b""):
            with socket.create_connection((host, port), timeout=5) as s:
                s.sendall(payload)
        refused = False
        try:
            TCPStore(host, port, b"not the secret", timeout=5)
        except AuthenticationError:
            refused = True
        with TCPStore(host, port, b"campaign", timeout=5) as c:
            c.set("a", b"1")
            served = c.get("a") == b"1"
        took = time.monotonic() - t0
        end = time.monotonic() + 3
        while srv.num_connections() and time.monotonic() < end:
            time.sleep(0.05)
        left = srv.num_connections()
    finally:
        srv.close()
    ok = refused and served and left == 0
    return Outcome(ok, f"wrong secret refused={refused}, served={served}, open={left}", took)


def _mpi_job_ends(case: str, deadline: float = 30.0) -> Outcome:
    """A rank of an mpi-engine job dies: OpenMPI's own rule (its default) is to end the
    whole job, before any survivor's deadline can raise. What unison promises on this
    engine is mpirun's nonzero exit naming the dead rank, soon, with nothing left."""
    run = _run_job(case, "mpi")
    proc, tmp, ended = run.proc, run.tmp, run.ended
    if proc is None:
        return Outcome(False, "the job hung past 120 s", leftovers=run.leftovers())
    try:
        fault = tmp / "fault"
        fault_at = float(fault.read_text()) if fault.exists() else None
        finished = [f.name for f in tmp.glob("rank*.json") if '"no error"' in f.read_text()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    left = run.leftovers()
    text = proc.stdout + proc.stderr
    problems = []
    if proc.returncode == 0:
        problems.append("mpirun exited 0")
    if f"rank {VICTIM}" not in text:
        problems.append(f"mpirun's output does not name rank {VICTIM}")
    if finished:
        problems.append(f"a survivor finished without an error: {finished}")
    tte = None if fault_at is None else ended - fault_at
    if tte is None:
        problems.append("the fault never happened")
    elif tte > deadline:
        problems.append(f"the job ended {tte:.1f} s after the fault (promised {deadline:g} s)")
    if left:
        problems.append("leftovers")
    return Outcome(not problems, "; ".join(problems) or "mpirun ended the job", tte, left)


def _mpi_available() -> bool:
    import importlib.util

    mpirun = Path(sys.executable).parent / "mpirun"
    return bool((mpirun.exists() or shutil.which("mpirun")) and importlib.util.find_spec("mpi4py"))


def _skip(why: str) -> Outcome:
    return Outcome(True, f"skipped: {why}")


CASES: list[Case] = [
    Case("native-kill", lambda: _job_case("native:kill", "any"), quick=True),
    Case("native-exit", lambda: _job_case("native:exit", "PeerLost")),
    Case("native-stop", lambda: _job_case("native:stop", "any", deadline=9.0)),
    Case("native-root-mismatch", lambda: _job_case("native:mismatch", "mismatch"), quick=True),
    Case("torch-engine-kill", lambda: _job_case("torch:kill", "PeerLost", deadline=9.0)),
    Case("torch-engine-mismatch", lambda: _job_case("torch:mismatch-dtype", "mismatch")),
    Case(
        "mpi-engine-mismatch",
        lambda: (
            _job_case("mpi:mismatch-dtype", "mismatch", engine="mpi")
            if _mpi_available()
            else _skip("no mpirun/mpi4py")
        ),
    ),
    Case(
        "mpi-engine-reduce-scatter",
        lambda: (
            _job_case("mpi:reduce-scatter", "ok", engine="mpi")
            if _mpi_available()
            else _skip("no mpirun/mpi4py")
        ),
    ),
    Case(
        "mpi-engine-kill",
        lambda: _mpi_job_ends("mpi:kill") if _mpi_available() else _skip("no mpirun/mpi4py"),
    ),
    Case(
        "mpi-engine-exit",
        lambda: _mpi_job_ends("mpi:exit") if _mpi_available() else _skip("no mpirun/mpi4py"),
    ),
    Case("unison.torch-kill", lambda: _job_case("hvd:kill", "any")),
    Case("unison.torch-exit", lambda: _job_case("hvd:exit", "any")),
    Case("unison.torch-stop", lambda: _job_case("hvd:stop", "any", deadline=9.0)),
    Case("c10d-ddp-kill", lambda: _job_case("ddp:kill", "any", deadline=9.0)),
    Case("c10d-ddp-exit", lambda: _job_case("ddp:exit", "any", deadline=9.0)),
    Case("c10d-ddp-stop", lambda: _job_case("ddp:stop", "any", deadline=9.0)),
    Case("store-strangers-memory", _store_strangers, quick=True),
    Case("store-hostile-clients", _store_junk, quick=True),
]


def run_case(case: Case) -> Outcome:
    try:
        return case.run()
    except Exception as exc:  # a broken case is a failed case
        return Outcome(False, f"the case itself failed: {exc!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m unison.testing.campaign", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="only the short part (make test)")
    ap.add_argument("--only", nargs="*", default=None, help="case names to run")
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        _rank(args.rank)
        return 0
    chosen = [
        c
        for c in CASES
        if (not args.quick or c.quick) and (args.only is None or c.name in args.only)
    ]
    print(f"{'case':<28}{'result':<8}{'time to error':<15}leftovers / detail", flush=True)
    failed = 0
    for case in chosen:
        out = run_case(case)
        if case.known:
            result = "FIXED" if out.ok else "KNOWN"
            out.detail += f" (known: {case.known})"
        else:
            result = "ok" if out.ok else "FAIL"
            failed += not out.ok
        tte = f"{out.time_to_error:.2f} s" if out.time_to_error is not None else "-"
        left = ", ".join(out.leftovers) if out.leftovers else "none"
        print(f"{case.name:<28}{result:<8}{tte:<15}{left}; {out.detail}", flush=True)
    print(f"{len(chosen) - failed} of {len(chosen)} cases as promised", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
