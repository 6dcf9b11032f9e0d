"""The ``fnmap`` command line.  Each subcommand lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import sys

#: Modules under fnmap.cli that add subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = ["emulator", "deploy", "jobs"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fnmap",
        description="Run Python functions over many inputs on serverless compute, or on the local emulator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"fnmap.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one-line reason, non-zero exit
        from ..errors import FnmapError

        if not isinstance(e, (FnmapError, OSError)):
            raise
        print(f"fnmap {args.command}: error: {e}", file=sys.stderr)
        return 1
