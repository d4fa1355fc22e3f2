"""Every command and snippet of README.md and docs/ is run here, or skipped for a reason
written below (other hosts, root, a placeholder for the reader's own script, ...).

The fenced blocks are read from the Markdown: a shell block's commands (continuation
lines joined, ``for ... done`` kept whole, output lines left out), a python block whole.
Each one must match a rule of :data:`RULES`; one that matches none fails
:func:`test_every_command_is_accounted_for`, so a new command in the docs needs a
decision here. Commands run from a scratch directory that sees the repository's
``examples/`` and ``benchmarks/``, with this interpreter's ``unison`` and ``python``
first on ``PATH``; a run passes when it exits 0 (the examples exit non-zero below their
accuracy bar, snippets assert their results)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("", "sh", "bash", "shell", "console")
#: the programs a shell line may start with; other lines in a shell block are output
PROGRAMS = {
    "unison", "python", "make", "pip", "mpirun", "torchrun", "horovodrun", "sudo", "ssh",
    "ssh-copy-id", "cd", ".venv/bin/unison", ".venv/bin/python", "for",
}  # fmt: skip


@dataclass(frozen=True)
class Item:
    doc: str  # path relative to the repository
    lang: str  # "shell" or "python"
    text: str  # one shell command, or one python snippet

    @property
    def id(self) -> str:
        first = self.text.strip().splitlines()[0][:60]
        return f"{self.doc}: {first}"


def _commands(body: str) -> list[str]:
    lines: list[str] = []
    for raw in body.splitlines():
        line = raw.rstrip()
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1].rstrip() + " " + line.strip()
        else:
            lines.append(line)
    out: list[str] = []
    loop: list[str] | None = None
    for line in lines:
        text = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
        if not text or text.startswith("#"):
            continue
        if loop is not None:
            loop.append(text)
            if text == "done":
                out.append("\n".join(loop))
                loop = None
            continue
        words = [w for w in text.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
        if not words or words[0] not in PROGRAMS or (words[1:2] and words[1].endswith(":")):
            continue  # output shown in the docs ("unison run: rank 1 failed first ...")
        if words[0] == "for":
            loop = [text]
            continue
        made = [i for i, c in enumerate(out) for f in re.findall(r"\S+\.json", text) if f in c]
        if made:  # it reads what an earlier command of the block wrote: one item, in order
            text = out.pop(made[0]) + "\n" + text
        out.append(text)
    return out


def collect() -> list[Item]:
    items = []
    for path in DOCS:
        doc = str(path.relative_to(ROOT))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", path.read_text(), re.S | re.M):
            lang, body = m.group(1), m.group(2)
            if lang == "python":
                items.append(Item(doc, "python", body))
            elif lang in SHELL:
                items += [Item(doc, "shell", c) for c in _commands(body)]
    return items


def _have(*modules: str) -> str | None:
    """None when every module imports here, else the skip reason."""
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(gone)}, not installed here" if gone else None


RUN = "run"
#: (regex searched in the command or snippet, what to do): RUN, RUN with a launch
#: command for a python snippet ("run: unison run -np 2 python {file}"), or a reason
#: to skip. The first match wins.
RULES: list[tuple[str, str]] = [
    # placeholders and fragments
    (r"\btrain(_ps)?\.py\b", "train.py stands for the reader's own script"),
    (r"--validate bench\.json", "bench.json stands for the reader's file (docs/simulate.md "
                                "runs the bench and the validation below it)"),
    (r"^(import unison\.torch as hvd|import unison\.torch\.distributed)\s+#[^\n]*\n"
     r"(dist\.init_process_group[^\n]*\n)?$",
     "one line to change in the reader's script, not a program"),
    (r"model, opt = Net\(\)", "a fragment of examples/elastic_digits.py (run above)"),
    (r"kv = ps\.init\(consistency=ps\.BSP\(\)\)\s+# a replacement",
     "a fragment of an elastic parameter-server worker (examples/ps_digits.py)"),
    (r"RayExecutor\(settings, min_workers", "a fragment: the elastic RayExecutor's arguments"),
    (r"from unison\.ray import RayExecutor", "a sketch: `...` stands for a training function "
                                             "(examples/ray_digits.py is the whole one)"),
    # what needs more than this machine
    (r"-H node|--hostfile hosts|^ssh|^ssh-copy-id|^cd /shared", "needs other hosts over ssh"),
    (r"^sudo ", "needs root (network namespaces)"),
    (r"^make (demo|test|demo-keras)\b", "creates .venv and installs the frameworks: what CI's "
                                        "own set-up does"),
    (r"^pip install", "installs from the package index (tests/test_install.py installs the "
                      "built wheel into a fresh venv)"),
    (r"pytorch_synthetic_benchmark\.py|c10d_overhead\.py",
     "a benchmark, for a quiet machine (benchmarks/)"),
    # run elsewhere in `make test`
    (r"^(KERAS_BACKEND=(tensorflow|jax)\s+)?unison run -np 2 python "
     r"examples/(tensorflow2_digits|keras_digits)\.py$",
     "make test-notorch runs it (a venv with TensorFlow, Keras and JAX, without torch)"),
    # what runs
    (r"^import numpy as np\nimport unison as un\n", "run: unison run -np 2 python {file}"),
    (r"^import numpy as np\n\nimport unison\.ps as ps\n",
     "run: unison run -np 3 --servers 1 python {file}"),
    (r"examples/ray_digits\.py", _have("ray") or RUN),
    (r"KERAS_BACKEND=jax", _have("keras", "jax") or RUN),
    (r"KERAS_BACKEND=torch", _have("keras", "torch") or RUN),
    (r"keras_digits|tensorflow2_digits", _have("keras", "tensorflow") or RUN),
    (r"^mpirun ", (None if shutil.which("mpirun") else "needs mpirun") or _have("mpi4py") or RUN),
    (r"--compare gloo,mpi", _have("torch", "mpi4py") or RUN),
    (r"^(KERAS_BACKEND=\w+ +)?unison (run|bench|simulate) ", RUN),
]  # fmt: skip


def decide(item: Item) -> str | None:
    for pattern, what in RULES:
        if re.search(pattern, item.text, re.M):
            return what
    return None


ITEMS = collect()


def _same(item: Item) -> str:
    return f"{item.lang}: {' '.join(item.text.split())}"


#: the first place each command appears: a command shown in several places runs once
FIRST: dict[str, Item] = {}
for _item in ITEMS:
    FIRST.setdefault(_same(_item), _item)


def test_every_command_is_accounted_for() -> None:
    assert len(ITEMS) > 30, "the Markdown reader found too few blocks"
    unknown = [i.id for i in ITEMS if decide(i) is None]
    assert not unknown, f"commands in the docs that no rule runs or skips: {unknown}"


def _env(scratch: Path) -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    shims = scratch / ".bin"  # `python` is this interpreter even where only python3 exists
    shims.mkdir(exist_ok=True)
    shim = shims / "python"  # a script, not a link: a venv is found from the path run
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(shims), bindir, os.environ.get("PATH", "")]),
        "PYTHONPATH": str(ROOT),
    }
    if os.geteuid() == 0:  # Open MPI refuses root unless told (CI containers run as root)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


@pytest.mark.timeout(900)
@pytest.mark.parametrize("item", ITEMS, ids=[i.id for i in ITEMS])
def test_command_runs(item: Item, tmp_path: Path) -> None:
    what = decide(item)
    if what is None:
        pytest.fail("no rule for this command (see test_every_command_is_accounted_for)")
    if what != RUN and not what.startswith("run: "):
        pytest.skip(what)
    first = FIRST[_same(item)]
    if first is not item:
        pytest.skip(f"the same command as in {first.doc} (run there)")
    for name in ("examples", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    if item.lang == "python":
        assert what.startswith("run: "), f"a python snippet needs a launch command: {item.id}"
        (tmp_path / "snippet.py").write_text(item.text)
        command = what[len("run: ") :].format(file="snippet.py")
    else:
        command = item.text
    r = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert r.returncode == 0, (
        f"{command}\nexit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )


def test_relative_links_resolve() -> None:
    """Every relative link of README.md, docs/ and examples/README.md names a file that exists."""
    missing = []
    for path in [*DOCS, ROOT / "examples" / "README.md", ROOT / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not missing, missing
