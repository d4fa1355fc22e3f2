__version__ = "0.1.0"

#: the distribution to ``pip install`` (the import name stays ``unison``, as
#: scikit-learn's is ``sklearn``): ``unison`` on the package index is another project's
DISTRIBUTION = "unison-collectives"


def install_hint(extra: str = "") -> str:
    """The command that installs unison with ``extra``: ``pip install 'NAME[extra]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"


def require_framework(module: str, layer: str, extra: str) -> None:
    """Import ``module`` for ``layer`` (e.g. ``unison.tensorflow``); where it is not
    installed, raise ``ModuleNotFoundError`` with one line naming the command that
    installs it (the framework's own errors, once it is installed, pass unchanged)."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ModuleNotFoundError(
            f"{layer} needs {module}, which is not installed: {install_hint(extra)}", name=module
        ) from None
