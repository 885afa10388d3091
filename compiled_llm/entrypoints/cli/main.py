"""The `compiled-llm` command line: the dispatcher. Each subcommand's module registers its
parser; the engine flags they share are generated from EngineArgs (cli/args.py)."""

from __future__ import annotations

import argparse
import atexit
import importlib.metadata
import os
import sys
import threading

from compiled_llm.entrypoints.cli import bench, generate, openai_client, run_batch, serve
from compiled_llm.entrypoints.cli import compile as compile_cmd
from compiled_llm.entrypoints.cli.args import ArgumentParser
from compiled_llm.entrypoints.cli.config_file import config_path, expand_config

# each has add_parser(subparsers); openai_client's registers `chat` and `complete`
SUBCOMMANDS = (generate, compile_cmd, serve, bench, openai_client, run_batch)


def build_parser() -> argparse.ArgumentParser:
    """The `compiled-llm` parser with every subcommand; no parser takes abbreviated flags."""
    parser = ArgumentParser(prog="compiled-llm")
    parser.add_argument("-v", "--version", action="version", version=_version())
    # a subparsers action makes its parsers of its parent's class: every level refuses them
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def _version() -> str:
    """The installed distribution's version (read without importing the package: no torch)."""
    try:
        return importlib.metadata.version("compiled-llm")
    except importlib.metadata.PackageNotFoundError:  # a tree on sys.path, not installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Parse argv and run the subcommand; bad input exits 2 with the message."""
    parser = build_parser()
    args = sys.argv[1:] if argv is None else list(argv)
    path = config_path(args)
    if path is not None:  # the file's flags first: the command line's own win
        try:
            args = expand_config(args, path)
        except ValueError as e:
            parser.error(str(e))
    ns = parser.parse_args(args)
    try:
        code = ns.func(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    if argv is None:  # this process's own command line: the interpreter exits next
        _exit_without_teardown(code)
    return code


def _exit_without_teardown(code: int) -> None:
    # The interpreter's teardown collects every object torch, Dynamo, Inductor and
    # transformers made (~460k, 1.3-1.5 s of a 9 s warm `compile` on the CPU) only to give
    # the memory back. The exit hooks run as they would, the output is flushed, and then the
    # process ends; with a non-daemon thread still running it exits the usual way (joining it).
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    if "torch" in sys.modules:  # Inductor's compile workers told to stop, not waited for
        from compiled_llm.compat import stop_compile_workers_nowait

        stop_compile_workers_nowait()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.exit's mapping: None is success, an int is the status, anything else is 1
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


if __name__ == "__main__":
    sys.exit(main())
