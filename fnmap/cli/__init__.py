"""The ``fnmap`` command line.  Each subcommand lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: Modules under fnmap.cli that add subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = ["emulator", "deploy", "jobs", "redrive", "dashboard", "prices", "cache"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fnmap",
        description="Run Python functions over many inputs on serverless compute, or on the local emulator.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"fnmap {__version__}")
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
    except BrokenPipeError:
        # `fnmap logs ID | head`: the reader has gone, as for any Unix tool; say nothing.
        # Point stdout at devnull so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as e:  # one-line reason, non-zero exit
        from ..errors import FnmapError

        if not isinstance(e, (FnmapError, OSError)):
            raise
        print(f"fnmap {args.command}: error: {e}", file=sys.stderr)
        return 1
