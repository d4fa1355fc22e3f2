"""A new user's install: the wheel built from this tree, installed by its distribution name
into a fresh virtual environment (numpy is its only dependency), runs the README's numpy
snippet and a `unison run -np 2 python -c ...` job, from outside the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _readme_numpy_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    (snippet,) = [b for b in blocks if b.startswith("import numpy as np\nimport unison as un\n")]
    return snippet


@pytest.mark.timeout(900)
def test_wheel_installs_by_its_name_and_runs_the_readme(tmp_path: Path) -> None:
    from unison._version import DISTRIBUTION, __version__

    # build from a copy of the sources, so the checkout gets no build/ or egg-info
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "unison", src / "unison", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    r = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(dist), str(src)],
        tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith(f"{DISTRIBUTION.replace('-', '_')}-{__version__}-")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"{wheel.name.split('-')[0]}-{__version__}.dist-info/METADATA").decode()
        names = z.namelist()
    assert f"Name: {DISTRIBUTION}\n" in meta
    assert [
        x for x in meta.splitlines() if x.startswith("Requires-Dist:") and "extra" not in x
    ] == ["Requires-Dist: numpy>=1.24"]
    assert "unison/py.typed" in names and "unison/torch/__init__.py" in names

    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert r.returncode == 0, r.stderr
    py, bindir = venv / "bin" / "python", venv / "bin"
    r = _run([str(py), "-m", "pip", "install", str(wheel)], tmp_path, timeout=600)
    if r.returncode != 0 and "numpy" in r.stderr and "No matching distribution" in r.stderr:
        pytest.skip(f"numpy cannot be installed here (no index or cache): {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr[-3000:]

    # from outside the checkout: the installed package, not the source tree
    work = tmp_path / "work"
    work.mkdir()
    r = _run([str(py), "-c", "import unison; print(unison.__file__)"], work)
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr
    for script in ("unison", DISTRIBUTION):
        r = _run([str(bindir / script), "--version"], work)
        assert r.returncode == 0 and __version__ in r.stdout + r.stderr, (script, r)

    (work / "snippet.py").write_text(_readme_numpy_snippet())
    r = _run([str(bindir / "unison"), "run", "-np", "2", str(py), "snippet.py"], work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    code = (
        "import numpy as np, unison as un; un.init(); x = np.arange(4.0) * (un.rank() + 1); "
        "un.all_reduce(x); assert (x == np.arange(4.0) * 3).all(), x; "
        "print('rank', un.rank(), 'ok', x.tolist()); un.shutdown()"
    )
    r = _run([str(bindir / "unison"), "run", "-np", "2", str(py), "-c", code], work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(x for x in r.stdout.splitlines() if " ok " in x) == [
        "[0] rank 0 ok [0.0, 3.0, 6.0, 9.0]",
        "[1] rank 1 ok [0.0, 3.0, 6.0, 9.0]",
    ], r.stdout
