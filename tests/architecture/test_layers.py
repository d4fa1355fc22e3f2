"""The import-layer contract (docs/architecture.md): a module may import only from its
own layer or the layers below it. Checked on the source with ``ast`` (every import,
also those inside functions), so a future upward import fails ``make test``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "unison"

#: top to bottom; a module belongs to the first layer with a matching prefix
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "applications and tools",
        (
            "unison.__init__",
            "unison.__main__",
            "unison.launch",
            "unison.bench",
            "unison.simulate",
            "unison.torch",
            "unison.horovod",
            "unison.ps",
            "unison.tensorflow",
            "unison.keras",
            "unison.ray",
            "unison.testing",
        ),
    ),
    ("public API", ("unison.comm.__init__", "unison.comm.api", "unison.comm.objects")),
    ("world", ("unison.world",)),
    ("backends", ("unison.backends",)),
    ("shared layer", ("unison.comm",)),
    ("algorithms", ("unison.algorithms",)),
    # how processes find each other and agree on a world: the peer mesh over the
    # transports' handshake (bootstrap) and the elastic rounds in the store (elastic's
    # worker side; its driver side is launch's)
    ("rendezvous", ("unison.bootstrap", "unison.elastic")),
    ("transport", ("unison.transport",)),
    # a test tool the native runtime loads only when UNISON_FAULTS is set: above the
    # base it uses (errors), below everything that may install it
    ("fault injection (tests only)", ("unison.testing.faults",)),
    (
        "base",
        (
            "unison.store",
            "unison.jobenv",
            "unison.jobdir",
            "unison.config",
            "unison.log",
            "unison.buffers",
            "unison.link",
            "unison.errors",
            "unison._types",
            "unison._version",
            "unison._completion",
        ),
    ),
]

#: known upward imports, each with the reason it is still there (keep this short)
ALLOWED: set[tuple[str, str]] = set()


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts)


def _layer(mod: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer), longest prefix wins
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if mod == p or mod.startswith(p + "."):
                if best is None or len(p) > best[0]:
                    best = (len(p), i)
    return None if best is None else best[1]


def _imports(path: Path, mod: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    if path.name == "__init__.py":
        pkg = mod.removesuffix(".__init__")
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("unison"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("unison"):
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{a.name}"
                sub_path = PKG.parent / Path(*sub.split("."))
                is_mod = sub_path.with_suffix(".py").exists() or sub_path.is_dir()
                out.add(sub if is_mod else target)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PKG.rglob("*.py"):
        mod = _module(path)
        graph[mod] = _imports(path, mod)
    return graph


def _resolve(target: str) -> str:
    p = PKG.parent / Path(*target.split("."))
    return f"{target}.__init__" if p.is_dir() else target


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in _graph() if _layer(m) is None)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_no_upward_imports() -> None:
    bad = []
    for mod, targets in sorted(_graph().items()):
        lm = _layer(mod)
        for t in sorted(targets):
            lt = _layer(_resolve(t))
            if lm is None or lt is None or lt >= lm or (mod, t) in ALLOWED:
                continue
            bad.append(f"{mod} ({LAYERS[lm][0]}) imports {t} ({LAYERS[lt][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


@pytest.mark.parametrize("mod", ["unison.link", "unison.errors", "unison._completion"])
def test_bottom_modules_import_nothing_of_unison(mod: str) -> None:
    assert not _graph()[mod], f"{mod} must stay at the bottom"
