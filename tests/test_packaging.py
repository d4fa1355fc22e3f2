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
    for extra in ("torch", "demo", "tensorflow"):
        (torch,) = [r for r in EXTRAS[extra] if _name(r) == "torch"]
        assert "==" not in torch and ">=" in torch, (extra, torch)
    assert PROJECT["dynamic"] == ["version"] and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "unison._version.__version__"
    }
    import unison

    assert unison.__version__ == ast.literal_eval(
        (ROOT / "unison" / "_version.py").read_text().split("=", 1)[1].strip()
    )


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
    assert PROJECT["scripts"] == {"unison": "unison.launch.cli:main"}
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
