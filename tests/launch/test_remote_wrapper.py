"""The remote side of a rank (``python -m unison.launch.remote``), driven directly:
errors name the host and what failed, control lines deliver signals, and end of file
on its stdin (the launcher or ssh gone) ends the rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _wrapper(header: dict[str, object]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "unison.launch.remote"], env=ENV, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(header) + "\n")
    proc.stdin.flush()
    return proc


def test_missing_directory_and_unreachable_store_are_named(tmp_path: Path) -> None:
    base = {"argv": ["true"], "env": {}, "host": "node7"}
    p = _wrapper({**base, "cwd": str(tmp_path / "gone")})
    _, err = p.communicate(timeout=30)
    assert p.returncode == 1
    assert f"host node7: cannot change to the launch directory '{tmp_path / 'gone'}'" in err
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = _wrapper({**base, "store": ["127.0.0.1", port], "start_timeout": 2})
    _, err = p.communicate(timeout=30)
    assert p.returncode == 1
    assert f"host node7: cannot reach the launcher's rendezvous store at 127.0.0.1:{port}" in err
    p = _wrapper({**base, "argv": ["no-such-program-xyz"]})
    _, err = p.communicate(timeout=30)
    assert p.returncode == 127 and "'no-such-program-xyz': command not found" in err


def test_signals_and_hang_up(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('GOT USR1', flush=True))\n"
        "print('PID', os.getpid(), os.environ['FROM_HEADER'], os.getcwd(), flush=True)\n"
        "time.sleep(60)\n"
    )
    p = _wrapper(
        {"argv": [sys.executable, "-c", script], "env": {"FROM_HEADER": "yes"},
         "cwd": str(tmp_path), "host": "h"}
    )  # fmt: skip
    assert p.stdout is not None and p.stdin is not None
    words = p.stdout.readline().split()
    assert words[0] == "PID" and words[2:] == ["yes", str(tmp_path)], words
    pid = int(words[1])
    p.stdin.write(f"SIG {int(signal.SIGUSR1)}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "GOT USR1"
    p.stdin.close()  # the connection is gone: the rank must go too
    p.wait(timeout=20)
    assert p.returncode == 128 + signal.SIGTERM or p.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


READER = (
    "import os, sys\n"
    "data = sys.stdin.buffer.read()\n"
    "print('IN', os.environ['UNISON_RANK'], data.hex(), flush=True)\n"
)


def test_stdin_reaches_remote_and_local_ranks(tmp_path: Path) -> None:
    """``--stdin`` through remote wrappers (``IN`` frames on the control channel, next
    to ``SIG`` lines) and local pipes: each chosen rank gets the whole stream, byte for
    byte; the others read /dev/null. The rsh agent here is ``env``: no shell, no ssh."""
    data = bytes(range(256)) * 50 + b"\n last line without newline"
    (tmp_path / "in").write_bytes(data)
    base = [
        sys.executable, "-m", "unison", "run", "-np", "3", "-H", "localhost:1,fakehost:2",
        "--rsh", "env UNISON_TEST_HOST={host}", "--store-addr", "127.0.0.1",
    ]  # fmt: skip
    for spec, readers in (("all", {0, 1, 2}), ("2", {2})):
        with open(tmp_path / "in", "rb") as fh:
            out = subprocess.run(
                [*base, "--stdin", spec, sys.executable, "-c", READER],
                env=ENV, stdin=fh, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        assert out.returncode == 0, out.stderr
        got = {int(w[1]): bytes.fromhex(w[2] if len(w) > 2 else "")
               for w in (line.split(" ", 3)[1:] for line in out.stdout.splitlines())}  # fmt: skip
        assert got == {r: (data if r in readers else b"") for r in range(3)}, spec
