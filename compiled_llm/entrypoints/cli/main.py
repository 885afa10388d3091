"""The `compiled-llm` command line: the dispatcher. Each subcommand's module registers its
parser; the engine flags they share are generated from EngineArgs (cli/args.py)."""

from __future__ import annotations

import argparse
import sys

from compiled_llm.entrypoints.cli import bench, generate, serve
from compiled_llm.entrypoints.cli import compile as compile_cmd

SUBCOMMANDS = (generate, compile_cmd, serve, bench)  # each has add_parser(subparsers)


def build_parser() -> argparse.ArgumentParser:
    """The `compiled-llm` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="compiled-llm")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv and run the subcommand; bad input exits 2 with the message."""
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
