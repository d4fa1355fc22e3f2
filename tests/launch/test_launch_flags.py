"""``unison run`` with the flags people bring from mpirun/torchrun/horovodrun, signals
forwarded and escalated, torchrun's variables (an unchanged torch.distributed gloo
script runs), a failing rank's peers given the time to say why, unknown ``UNISON_*``
variables named once with the nearest known one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
CLI = [sys.executable, "-m", "unison", "run"]

FLAGS_SCRIPT = r"""
import json, os, signal, sys, time
got = []
def note(signum, frame):
    print("GOT", signum, flush=True)
for s in (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
    signal.signal(s, note)
keys = ("FOO", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "UNISON_SIZE")
line = sys.stdin.readline().strip()
print("ENV " + json.dumps({**{k: os.environ.get(k) for k in keys}, "stdin": line}), flush=True)
print("READY", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_flags_stdin_output_files_and_signal_forwarding(tmp_path: Path) -> None:
    script, out_dir = tmp_path / "job.py", tmp_path / "out"
    script.write_text(FLAGS_SCRIPT)
    argv = [*CLI, "--nproc-per-node", "2", "-x", "FOO=bar", "--output-filename", str(out_dir),
            "--verbose", "--tag-output", sys.executable, str(script)]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdin and proc.stdout and proc.stderr
    proc.stdin.write("hello rank zero\n")
    proc.stdin.close()
    envs: dict[int, dict[str, str]] = {}

    def until(word: str, count: int) -> None:
        seen = 0
        while seen < count:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, proc.stderr.read()  # type: ignore[union-attr]
            if line.split("] ", 1)[1].startswith("ENV "):
                envs[int(line[1])] = json.loads(line.split("ENV ", 1)[1])
            seen += word in line

    try:
        until("READY", 2)
        for signum, expect in (
            (signal.SIGUSR1, signal.SIGUSR1),  # forwarded; the job goes on
            (signal.SIGINT, signal.SIGINT),  # the first Ctrl-C reaches ranks as SIGINT
            (signal.SIGINT, signal.SIGTERM),  # the second escalates
        ):
            proc.send_signal(signum)
            until(f"GOT {int(expect)}", 2)
        proc.send_signal(signal.SIGINT)  # the third: SIGKILL
        proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert envs[0]["stdin"] == "hello rank zero" and envs[1]["stdin"] == ""  # mpirun's default
    for r in (0, 1):
        e = envs[r]
        assert e["FOO"] == "bar" and e["RANK"] == str(r) and e["WORLD_SIZE"] == "2", e
        assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == (str(r), "2", "0")
        assert e["ROLE_RANK"] == str(r) and e["MASTER_ADDR"] == "127.0.0.1", e
        assert e["MASTER_PORT"] == envs[0]["MASTER_PORT"] and e["UNISON_SIZE"] == "2"
        saved = (out_dir / "1" / f"rank.{r}" / "stdout").read_text()
        assert saved.startswith("ENV ") and "READY" in saved, saved  # no [rank] prefix there
    assert "unison run: rank 1: " in err and "job.py" in err  # --verbose
    assert "UNISON_SECRET" not in err


def test_unchanged_torch_distributed_gloo_script(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([dist.get_rank() + 1.0])\n"
        "dist.all_reduce(t)\n"
        "print('SUM', t.item(), dist.get_world_size(), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    r = subprocess.run(
        [*CLI, "-np", "2", sys.executable, str(script)],
        capture_output=True, text=True, env=ENV, timeout=80,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[0] SUM 3.0 2", "[1] SUM 3.0 2"], r.stdout


def test_failing_rank_peers_say_why_and_typo_warned_once(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, time, numpy as np, unison as un\n"
        "un.init()\n"
        "un.barrier()\n"
        "if un.rank() == 2:\n"
        "    sys.exit(3)\n"
        "time.sleep(0.5)  # busy elsewhere: they learn of the loss only at their next call\n"
        "while True:\n"
        "    un.all_reduce(np.ones(4))\n"
    )
    env = dict(ENV, UNISON_TIMEOUTT="5")
    r = subprocess.run(
        [*CLI, "-np", "3", "--timeout", "30", sys.executable, str(script)],
        capture_output=True, text=True, env=env, timeout=80,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "rank 2 failed first (exit code 3)" in r.stderr
    for rank in (0, 1):  # each survivor printed its own error before being ended
        assert any(  # sys.exit runs unison's exit hook (as Horovod's): rank 2 says goodbye
            line.startswith(f"[{rank}] unison.errors.")
            and ("rank 2 was lost" in line or "rank 2 has shut down" in line)
            for line in r.stderr.splitlines()
        ), r.stderr
    typo = [line for line in r.stderr.splitlines() if "UNISON_TIMEOUTT" in line]
    assert len(typo) == 1 and "did you mean UNISON_TIMEOUT?" in typo[0], r.stderr
    assert typo[0].startswith("[0] ")


def test_progress_redraws_to_a_pipe_are_one_line_with_one_prefix(tmp_path: Path) -> None:
    script = tmp_path / "bar.py"
    script.write_text(
        "import os, sys\n"
        "print('tty', os.environ.get('UNISON_OUTPUT_TTY'), flush=True)\n"
        "for epoch in (1, 2):\n"
        "    for pct in (0, 50, 100):\n"
        "        sys.stderr.write(f'\\repoch {epoch}: {pct}%|###|'); sys.stderr.flush()\n"
        "    sys.stderr.write('\\r' + ' ' * 20 + '\\r'); sys.stderr.flush()\n"
        "    print(f'epoch {epoch} done', flush=True)\n"
        "sys.stderr.write('dos line\\r\\n')\n"
    )
    r = subprocess.run(
        [*CLI, "-np", "1", sys.executable, str(script)],
        capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == "[0] dos line\n", repr(r.stderr)  # cleared bars leave nothing
    assert r.stdout.splitlines() == ["[0] tty 0", "[0] epoch 1 done", "[0] epoch 2 done"]
