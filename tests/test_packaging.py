"""Packaging as issue 18 asks: a torch range (no pin), one version source, an SPDX
license string with a LICENSE file that setuptools applies without a deprecation
warning, the ``unison`` console script next to ``python -m unison``, and a demo extra
that installs what the demo imports and no development tools."""

from __future__ import annotations

import ast
import re
import sys
import warnings
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
EXTRAS = PROJECT["optional-dependencies"]
IMPORT_NAMES = {"sklearn": "scikit-learn"}  # import name -> distribution name
DEV_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "ruff", "mypy", "py-spy"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower()


def test_torch_is_a_range_and_the_version_has_one_source() -> None:
    for extra in ("torch", "demo"):
        (torch,) = [r for r in EXTRAS[extra] if _name(r) == "torch"]
        assert "==" not in torch and ">=" in torch, (extra, torch)
    assert PROJECT["dynamic"] == ["version"] and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "unison._version.__version__"
    }
    import unison

    tree = ast.parse((ROOT / "unison" / "_version.py").read_text())
    (version,) = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and n.targets[0].id == "__version__"  # type: ignore[attr-defined]
        and isinstance(n.value, ast.Constant)
    ]
    assert unison.__version__ == version


def test_spdx_license_applied_without_deprecation_warning() -> None:
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    assert PROJECT["license"] == "Apache-2.0" and (ROOT / "LICENSE").is_file()
    assert not any(c.startswith("License ::") for c in PROJECT.get("classifiers", []))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SetuptoolsDeprecationWarning included
        dist = apply_configuration(Distribution(), str(ROOT / "pyproject.toml"))
    assert dist.metadata.license_expression == "Apache-2.0", setuptools.__version__


def test_console_script_and_demo_extra() -> None:
    assert PROJECT["scripts"] == {
        "unison": "unison.launch.cli:main",
        "unison-collectives": "unison.launch.cli:main",  # where Debian's unison comes first
    }
    assert (ROOT / "unison" / "__main__.py").is_file()  # python -m unison
    demo = {_name(r) for r in EXTRAS["demo"]}
    assert not demo & DEV_TOOLS, demo
    # the demo script and the example modules it imports from examples/ (digits_data)
    imported: set[str] = set()
    todo, seen = ["pytorch_digits"], set()
    while todo:
        mod = todo.pop()
        seen.add(mod)
        tree = ast.parse((ROOT / "examples" / f"{mod}.py").read_text())
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and not getattr(n, "level", 0):
                for a in n.names:
                    top = (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                    if (ROOT / "examples" / f"{top}.py").is_file():
                        todo += [] if top in seen else [top]
                    else:
                        imported.add(top)
    assert "digits_data" in seen, seen
    third_party = imported - set(sys.stdlib_module_names) - {"unison", "numpy", "__future__"}
    assert third_party, imported
    for mod in third_party:
        assert IMPORT_NAMES.get(mod, mod) in demo, (mod, demo)
    if "tqdm" in (ROOT / "examples" / "pytorch_digits.py").read_text():
        assert "tqdm" in demo


def test_distribution_name_and_hints_agree() -> None:
    """The index's ``unison`` is another project: the distribution has its own name, which
    every printed install hint uses; the import name stays ``unison``."""
    from unison._version import DISTRIBUTION, install_hint

    assert PROJECT["name"] == DISTRIBUTION != "unison"
    assert install_hint("tensorflow") == f"pip install '{DISTRIBUTION}[tensorflow]'"
    for path in (ROOT / "unison").rglob("*.py"):
        for line in path.read_text().splitlines():
            if "pip install" in line:
                assert "unison[" not in line and "install unison " not in line, (path, line)


def test_extras_are_ranges_and_frameworks_do_not_drag_each_other_in() -> None:
    for extra, reqs in EXTRAS.items():
        for r in reqs:
            assert "==" not in r, (extra, r)  # a pin would replace a user's own release
    names = {extra: {_name(r) for r in reqs} for extra, reqs in EXTRAS.items()}
    assert "torch" not in names["tensorflow"], names["tensorflow"]
    assert "tensorflow-cpu" not in names["tensorflow"]  # GPU users have `tensorflow`
    assert names["keras"] == {"keras"}  # the backend is the user's own extra
    assert names["demo"] == {"torch", "scikit-learn", "tqdm"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("layer", "framework", "extra"),
    [("torch", "torch", "torch"), ("tensorflow", "tensorflow", "tensorflow"),
     ("keras", "keras", "keras")],
)  # fmt: skip
def test_framework_layer_without_its_framework_names_the_install(
    layer: str, framework: str, extra: str
) -> None:
    """Importing a framework layer where the framework is missing raises one line that
    names the command to run (the framework is hidden from a child interpreter)."""
    import subprocess

    code = f"import sys; sys.modules[{framework!r}] = None; import unison.{layer}"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == (
        f"ModuleNotFoundError: unison.{layer} needs {framework}, which is not installed: "
        f"pip install 'unison-collectives[{extra}]'"
    ), r.stderr
