"""Run a script with torch (and any other framework named) impossible to import.

``python -m tests.horovod._no_torch FRAMEWORKS SCRIPT [ARGS...]`` installs an import
hook that refuses the comma-separated top-level modules, then runs SCRIPT as
``__main__``: a script that imports a refused framework, directly or through unison,
fails with ImportError.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
from typing import Any


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] in self.names:
            raise ImportError(f"{fullname} must not be imported here (refused by the test)")
        return None


def main() -> None:
    names = {n for n in sys.argv[1].split(",") if n}
    for n in list(sys.modules):
        if n.partition(".")[0] in names:
            raise SystemExit(f"{n} was imported before the hook")
    sys.meta_path.insert(0, _Refuse(names))
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
