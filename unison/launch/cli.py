"""The ``unison`` console script (also ``python -m unison.launch.cli``).

Subcommands live in :data:`SUBCOMMANDS`: name -> (module, one-line help). A module
provides ``configure_parser(parser)`` and ``main(args) -> int``; only the module of
the subcommand being run is imported, so ``unison run`` never pays for torch.
Adding ``bench`` or ``simulate`` is one line here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from typing import NoReturn

from .._version import __version__
from ..errors import InvalidArgumentError

__all__ = ["SUBCOMMANDS", "OneLineParser", "build_parser", "main"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("unison.launch.launcher", "start N ranks of a command (this host, or -H hosts)"),
    "info": ("unison.launch.info", "versions, transports, backends and configuration"),
    "bench": ("unison.bench.cli", "nccl-tests-style benchmarks against gloo and mpi"),
    "simulate": ("unison.simulate", "predict all-reduce times from the α-β-γ cost model"),
    "completion": (
        "unison.launch.shell_completion",
        "print a bash or zsh script that completes unison's subcommands and flags",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming what to do (with a close flag's name when one
    was mistyped), not the whole usage text: ``--help`` has that."""

    def error(self, message: str) -> NoReturn:
        hint = f"`{self.prog} --help` lists the options"
        if message.startswith("unrecognized arguments:"):
            wrong = message.split(":", 1)[1].split()
            close = [self.closest_option(w) for w in wrong if w.startswith("-")]
            named = [c for c in close if c]
            if named:
                hint = f"did you mean {' or '.join(named)}? ({hint})"
        self.exit(2, f"{self.prog}: error: {message}; {hint}\n")

    def option_strings(self) -> list[str]:
        """Every flag of this parser, in definition order."""
        return list(dict.fromkeys(o for a in self._actions for o in a.option_strings))

    def closest_option(self, word: str) -> str | None:
        """The flag ``word`` most likely meant (a typo), or None."""
        options = self.option_strings()
        close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.75)
        return close[0] if close else None


def _chosen(argv: list[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def build_parser(
    chosen: str | None, subparsers: dict[str, argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="unison", description="unison: collective communication for Python."
    )
    parser.add_argument("--version", action="version", version=f"unison {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if subparsers is not None:
            subparsers[name] = p
        if name == chosen:
            importlib.import_module(module).configure_parser(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen(argv)
    subparsers: dict[str, argparse.ArgumentParser] = {}
    parser = build_parser(chosen, subparsers)
    args, unknown = parser.parse_known_args(argv)
    if args.subcommand is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        parser.print_help(sys.stderr)
        return 2
    if unknown:  # under the subcommand's usage, not the top-level one
        subparsers[args.subcommand].error(f"unrecognized arguments: {' '.join(unknown)}")
    module = importlib.import_module(SUBCOMMANDS[args.subcommand][0])
    try:
        status: int = module.main(args)
        sys.stdout.flush()
    except InvalidArgumentError as exc:  # bad arguments: a usage error, not a traceback
        print(f"unison {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `unison info | head -1`: the reader left, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
