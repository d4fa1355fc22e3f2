"""Frameworks depend on the engine, not on each other (checked on the source with
``ast``, every import, also those inside functions): the engine imports no framework,
unison.tensorflow imports neither torch nor unison.torch, and unison.keras reaches
unison.torch only for Keras' own torch backend."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "unison"
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")

#: (module, imported) pairs that stay, each with its reason
ALLOWED = {
    # gloo_built()/gloo_enabled() ask torch.distributed, only once torch is found installed
    ("unison.horovod.basics", "torch.distributed"),
    # to_torch()/from_torch(), kept for callers that want torch tensors (the engine path
    # uses to_buffer()/from_buffer() and never calls them)
    ("unison.tensorflow._bridge", "torch"),
    # Keras' torch backend: its gradients are torch tensors, reduced by the torch front
    ("unison.keras._engine", "unison.torch.collectives"),
    ("unison.keras._engine", "unison.torch.compression"),
}


def _imports(path: Path) -> set[str]:
    rel = path.relative_to(PKG.parent).with_suffix("")
    pkg = list(rel.parts[:-1])  # the package a relative import starts from
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
    return out


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts)


def _edges(package: str) -> list[tuple[str, str]]:
    return [
        (_module(p), t) for p in sorted((PKG / package).rglob("*.py")) for t in sorted(_imports(p))
    ]


def _is(target: str, name: str) -> bool:
    return target == name or target.startswith(name + ".")


def test_the_engine_imports_no_framework_and_no_front() -> None:
    bad = [
        f"{m} imports {t}"
        for m, t in _edges("horovod")
        if (m, t) not in ALLOWED and any(_is(t, f) or _is(t, f"unison.{f}") for f in FRAMEWORKS)
    ]
    assert not bad, bad


def test_tensorflow_and_keras_fronts_do_not_depend_on_torch() -> None:
    bad = [
        f"{m} imports {t}"
        for pkg in ("tensorflow", "keras")
        for m, t in _edges(pkg)
        if (m, t) not in ALLOWED and (_is(t, "torch") or _is(t, "unison.torch"))
    ]
    assert not bad, bad
