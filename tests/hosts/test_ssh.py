"""``unison run -H`` through a real sshd in each namespaced host (ssh joins its
arguments and hands them to a shell: the bugs of remote launching live there).

One job checks quoting, ``-x``, the working directory, forwarded variables, the
store address picked on the route to the hosts, that rank 0 (on a remote host) reads
the launcher's stdin and the others /dev/null, and that the job secret is on no
command line while the job runs; two more prove that SIGINT and SIGTERM to the
launcher leave no process on the remote hosts within 5 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from unison.testing.netns import unavailable

from .bridged import IFACE, BridgedHosts
from .output import read_until
from .sshd import SshHosts, sshd_missing

WHY = unavailable() or sshd_missing()
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"no ssh test hosts: {WHY}"),
    pytest.mark.timeout(120),
]
ROOT = Path(__file__).resolve().parents[2]
STDIN = bytes(range(256)) * 40 + "héllo\n".encode()  # several frames, any byte
ARGS = ["two words", 'it\'s "quoted"', "$HOME;echo hi", "*.py", "héllo wörld ✓", "`id`", ""]

SCRIPT = r"""
import json, os, sys, time
import unison as un
un.init()
mode, flag = sys.argv[1], sys.argv[2]
if mode == "hang":
    un.barrier()
    print("READY", flush=True)
    time.sleep(60)
    sys.exit(0)
with open(os.path.join(flag, f"secret.{un.rank()}"), "w") as f:
    f.write(os.environ["UNISON_SECRET"])
un.barrier()
print("READY", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(flag, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
data = sys.stdin.buffer.read()
names = ("FOO", "BAR", "PYTHONPATH", "PATH", "RANK", "WORLD_SIZE", "MASTER_ADDR", "HOSTNAME_X")
seen = {k: os.environ.get(k) for k in names}
print("OUT " + json.dumps({"rank": un.rank(), "argv": sys.argv[3:], "cwd": os.getcwd(),
                            "env": seen, "store": os.environ["UNISON_STORE_ADDR"],
                            "stdin": data.hex()}), flush=True)
if un.rank() != 0:  # rank 0 leaves first, with no shutdown(): nobody logs its goodbye
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def ssh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BridgedHosts, SshHosts]]:
    hosts = BridgedHosts(2)
    try:
        sshd = SshHosts(hosts, tmp_path_factory.mktemp("sshd"))
    except BaseException:
        hosts.close()
        raise
    yield hosts, sshd
    sshd.close()
    hosts.close()


def _launch(
    hosts: BridgedHosts, sshd: SshHosts, tmp: Path, *args: str, stdin: bytes = b""
) -> subprocess.Popen[str]:
    (tmp / "stdin").write_bytes(stdin)
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    spec = ",".join(f"{hosts.host_addr(i)}:2" for i in range(len(hosts.names)))
    wd = tmp / "work dir"
    wd.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOSTNAME_X="kept", BAR="from-launcher")
    argv = [
        sys.executable, "-m", "unison", "run", "-np", "4", "-H", spec, "--rsh", sshd.rsh,
        "-x", "FOO=1", "-x", "BAR", "--iface", IFACE, "--timeout", "30",
        sys.executable, str(script), *args,
    ]  # fmt: skip
    with open(tmp / "stdin", "rb") as fh:
        return subprocess.Popen(
            argv, cwd=wd, env=env, stdin=fh, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip


def _remote_pids(hosts: BridgedHosts, sshd: SshHosts) -> list[str]:
    pids: list[str] = []
    for name in hosts.names:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids += [p for p in out.stdout.split() if p not in sshd.daemon_pids()]
    return pids


def _all_command_lines() -> str:
    return subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout


def test_arguments_environment_cwd_and_no_secret_in_ps(
    ssh: tuple[BridgedHosts, SshHosts], tmp_path: Path
) -> None:
    hosts, sshd = ssh
    proc = _launch(hosts, sshd, tmp_path, "check", str(tmp_path), *ARGS, stdin=STDIN)
    assert proc.stdout is not None
    try:
        head, ready = read_until(proc, lambda text: text.count("READY") >= 4, 120)
        assert ready, head + (proc.stderr.read() if proc.poll() is not None else "")
        secrets = {(tmp_path / f"secret.{r}").read_text() for r in range(4)}
        assert len(secrets) == 1 and len(secrets.pop()) == 64
        secret = (tmp_path / "secret.0").read_text()
        assert _remote_pids(hosts, sshd), "the ranks run in the namespaces"
        assert secret not in _all_command_lines()  # every host's processes: one pid space
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                assert secret.encode() not in cmdline, pid
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    out = head + out
    assert proc.returncode == 0, err
    assert secret not in out + err
    results = [json.loads(line.split("OUT ", 1)[1]) for line in out.splitlines() if "OUT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], out
    for r in results:
        assert r["argv"] == ARGS, r
        assert bytes.fromhex(r["stdin"]) == (STDIN if r["rank"] == 0 else b""), r["rank"]
        assert r["cwd"] == str(tmp_path / "work dir"), r
        env = r["env"]
        assert env["FOO"] == "1" and env["BAR"] == "from-launcher", env
        assert env["PYTHONPATH"] == str(ROOT) and env["PATH"] == os.environ["PATH"], env
        assert env["HOSTNAME_X"] == "kept" and env["RANK"] == str(r["rank"]), env
        assert env["WORLD_SIZE"] == "4" and env["MASTER_ADDR"] == hosts.host_addr(0), env
        # no --store-addr: the launcher's address on the route to the first host
        assert r["store"].rsplit(":", 1)[0] == hosts.launcher_addr, r
    assert "WARNING" not in err and "connection closed" not in err, err  # orderly: no log


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_leaves_nothing_remote(
    ssh: tuple[BridgedHosts, SshHosts], tmp_path: Path, signum: int
) -> None:
    hosts, sshd = ssh
    proc = _launch(hosts, sshd, tmp_path, "hang", str(tmp_path))
    assert proc.stdout is not None
    try:
        head, ready = read_until(proc, lambda text: text.count("READY") >= 4, 120)
        assert ready, head + (proc.stderr.read() if proc.poll() is not None else "")
        assert _remote_pids(hosts, sshd)
        proc.send_signal(signum)
        deadline = time.monotonic() + 5
        while _remote_pids(hosts, sshd) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _remote_pids(hosts, sshd) == []
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    assert f"interrupted by {signal.Signals(signum).name}" in err
