"""An elastic parameter-server job on two namespaced hosts: the host of workers 0 and 1
is lost (every process in its namespace SIGKILLed) while worker 2 and the server on the
other host go on; after its cool-down the host comes back and the launcher starts
replacements with ids 0 and 1 there, which join the running server across the bridge.
Under BSP every pull at one clock returns the same value on every worker, the
replacements' first pulls included, and every worker ends with the same parameters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unison.testing.netns import unavailable

from .bridged import IFACE, BridgedHosts
from .output import read_until
from .recovery_time import kill_host

WHY = unavailable()
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"no network namespaces: {WHY}"),
    pytest.mark.timeout(150),
]
ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "ps" / "_elastic_train.py"


def test_lost_host_of_workers_then_replacements_join_across_hosts(tmp_path: Path) -> None:
    hosts = BridgedHosts(2)
    try:
        h0, h1 = hosts.names
        script = tmp_path / "discover_hosts.sh"
        script.write_text(f"#!/bin/sh\necho {h0}:2\necho {h1}:2\n")
        script.chmod(0o755)
        argv = [
            sys.executable, "-m", "unison.launch.cli", "run",
            "-np", "4", "--min-np", "2", "--max-np", "4", "--servers", "1",
            "--host-discovery-script", str(script), "--blacklist-cooldown-range", "1", "2",
            "--rsh", "ip netns exec {host}", "--store-addr", hosts.launcher_addr,
            "--network-interface", IFACE, "--timeout", "30", "--elastic-timeout", "60",
            "-x", "PS_TEST_JOINS=2",
            sys.executable, str(TRAIN), "host", str(tmp_path), "8",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        assert proc.stdout is not None
        try:
            head, ready = read_until(proc, lambda text: "READY" in text, 120)
            if ready:
                assert kill_host(h0) >= 2  # workers 0 and 1 and their wrappers
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        hosts.close()
    stdout = head + out
    assert proc.returncode == 0, err[-4000:]
    assert f"; blacklist failing host: {h0} (for " in err, err[-4000:]
    for wid in (0, 1):
        assert f"starting worker {wid} on host {h0} (replaces the lost worker" in err, err
    pulls: dict[int, set[str]] = {}
    for m in re.finditer(r"PULL (\d+) (\d+) (\S+)", stdout):
        pulls.setdefault(int(m.group(2)), set()).add(m.group(3))
    assert sorted(pulls) == list(range(8)), pulls
    for clock, values in pulls.items():  # BSP: one value per clock on every worker
        assert len(values) == 1, (clock, values)
    joined = re.findall(r"JOINED (\d+) (\d+) (\d+) \[([\d.]+),", stdout)
    assert sorted(j[0] for j in joined) == ["0", "1"], stdout
    for _, clock, workers, value in joined:
        # the slowest live clock (worker 2 waits at 5) and exactly the servers' state
        assert (clock, workers) == ("5", "3") and pulls[5] == {f"{float(value):g}"}, joined
    final = re.findall(r"FINAL (\d+) (\d+) (\[.*\])", stdout)
    assert sorted(f[0] for f in final) == ["0", "1", "2"], stdout
    assert len({f[1:] for f in final}) == 1 and final[0][1] == "8", final
