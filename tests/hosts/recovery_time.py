"""Elastic recovery time on namespaced hosts: from a host's loss to the first completed
training step after it (issue 15's figure; target under 5 s plus one step).

An elastic ``unison run`` on two bridged network-namespace hosts (2 slots each) trains
``tests/elastic/_train.py``; at step 3 of the first world every process in the second
host's namespace is SIGKILLed (a lost host). The survivors roll back, the launcher
re-forms the world with the first host's ranks, and the first completed step after the
loss is timed. Its phases come from the survivors:

- detect: the loss -> a survivor's collective failed (connection reset by the kernel);
- re-form: -> the new world is formed (shutdown, wait for the launcher's next round,
  peer rendezvous);
- sync: -> rank 0's state is broadcast;
- step: -> the first step completed.

Needs root (network namespaces)::

    sudo .venv/bin/python -m tests.hosts.recovery_time --repeat 5

:func:`measure` is what ``tests/hosts/test_elastic_hosts.py`` runs (and logs).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .bridged import IFACE, BridgedHosts
from .output import read_until

__all__ = ["Measurement", "kill_host", "main", "measure"]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "elastic" / "_train.py"


@dataclass
class Measurement:
    returncode: int
    stdout: str
    stderr: str
    killed_at: float | None  # wall time of the loss
    #: per survivor: (wall time of its first completed step after the loss, wall time it
    #: saw the failure, then the re-form, sync and step seconds)
    recovered: list[tuple[float, float, float, float, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        """From the loss to the first completed step after it (the earliest survivor)."""
        if self.killed_at is None or not self.recovered:
            return None
        return min(r[0] for r in self.recovered) - self.killed_at

    @property
    def detect(self) -> float | None:
        """From the loss to the first failure a survivor saw."""
        if self.killed_at is None or not self.recovered:
            return None
        return min(self.recovered)[1] - self.killed_at

    def phases(self) -> str:
        if not self.recovered:
            return "no survivor reported a recovery"
        first = min(self.recovered)
        detect = first[1] - (self.killed_at or first[1])
        names = ("detect", "re-form", "sync", "step")
        values = (detect, *first[2:5])
        return ", ".join(f"{n} {v:.3f} s" for n, v in zip(names, values, strict=True))


def kill_host(netns: str) -> int:
    """SIGKILL every process in ``netns``; how many there were."""
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10
    ).stdout.split()
    for pid in out:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(out)


def measure(
    hosts: BridgedHosts, workdir: Path, *, grow_back: bool = True, timeout: float = 120
) -> Measurement:
    """One elastic job on ``hosts`` (two), losing the second host at step 3. With
    ``grow_back`` the host returns after a 3 s cool-down and the job ends in a world of
    4 again (round 2); without it the job ends with the survivors."""
    h0, h1 = hosts.names
    script = workdir / "discover_hosts.sh"
    script.write_text(f"#!/bin/sh\necho {h0}:2\necho {h1}:2\n")
    script.chmod(0o755)
    until = ["-x", "ELASTIC_TEST_UNTIL_ROUND=2", "-x", "ELASTIC_TEST_UNTIL_SIZE=4"]
    argv = [
        sys.executable, "-m", "unison.launch.cli", "run",
        "-np", "4", "--min-np", "2", "--max-np", "4",
        "--host-discovery-script", str(script), "--blacklist-cooldown-range", "3", "6",
        "--rsh", "ip netns exec {host}", "--store-addr", hosts.launcher_addr,
        "--network-interface", IFACE, "--timeout", "30", "--elastic-timeout", "60",
        *(until if grow_back else []), "-x", "ELASTIC_TEST_EPOCHS=1",
        sys.executable, str(TRAIN),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=workdir
    )
    assert proc.stdout is not None
    killed_at = None
    try:
        head, ready = read_until(proc, lambda text: "READY" in text, timeout)
        if ready:
            assert kill_host(h1) >= 2  # the wrappers and the ranks of that host
            killed_at = time.time()
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout = head + out
    recovered = [
        tuple(float(x) for x in line.split("RECOVERED_AT ", 1)[1].split()[:5])
        for line in stdout.splitlines()
        if "RECOVERED_AT " in line
    ]
    return Measurement(proc.returncode, stdout, err, killed_at, recovered)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="jobs to run (default 3)")
    args = ap.parse_args(argv)
    from unison.testing.netns import unavailable

    why = unavailable()
    if why is not None:
        print(f"cannot make network namespaces: {why}", file=sys.stderr)
        return 2
    hosts = BridgedHosts(2)
    times: list[float] = []
    try:
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                m = measure(hosts, Path(tmp), grow_back=False)
            if m.returncode != 0 or m.seconds is None:
                print(f"run {i + 1}: the job failed (status {m.returncode})\n{m.stderr[-3000:]}")
                return 1
            times.append(m.seconds)
            print(f"run {i + 1}: {m.seconds:.3f} s from the host's loss to the first "
                  f"completed step after it ({m.phases()})", flush=True)  # fmt: skip
            if m.detect is not None and m.detect > 5:  # what the survivors were doing
                for line in m.stderr.splitlines():
                    if "collective failed" in line or "CollectiveTimeout" in line:
                        print(f"    {line}")
    finally:
        hosts.close()
    print(
        f"recovery time over {len(times)} runs: min {min(times):.3f} s, "
        f"median {statistics.median(times):.3f} s, max {max(times):.3f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
