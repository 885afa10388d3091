"""`compiled-llm serve`: the OpenAI-compatible HTTP server; its flags come from EngineArgs,
ServeArgs (where to listen) and ServerConfig (the request guards)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from compiled_llm.config import check_choices
from compiled_llm.entrypoints.cli.args import (
    HelpFormatter,
    add_dataclass_args,
    add_engine_args,
    dataclass_from,
    engine_args,
)
from compiled_llm.entrypoints.server.server_config import ServerConfig

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


@dataclass
class ServeArgs:
    """Where `serve` listens and how it logs."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8000
    """Port to listen on."""
    served_model_name: str | None = None
    """The model name clients must send (default: --model, or 'demo')."""
    log_level: LogLevel = "info"
    """Log level of the server and the engine."""
    api_server_count: int = 1
    """API-server processes in front of the one engine core process, all on host:port (the
    kernel spreads connections over them); each does its own HTTP, tokenization,
    detokenization and streaming. 1: the server and the front end in this process."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0 <= self.port < 1 << 16:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_server_count < 1:
            raise ValueError(f"api_server_count must be >= 1, got {self.api_server_count}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `serve`: the engine flags, ServeArgs' and ServerConfig's."""
    parser = subparsers.add_parser("serve", formatter_class=HelpFormatter,
                                   help="serve the OpenAI-compatible HTTP API")
    add_engine_args(parser)
    add_dataclass_args(parser, ServeArgs, title="server options")
    # model_name is derived: --served-model-name, else --model
    add_dataclass_args(parser, ServerConfig, exclude=("model_name",), title="request guards")
    parser.set_defaults(func=run_serve)


def run_serve(ns: argparse.Namespace) -> int:
    """Build the engine and serve until interrupted."""
    import logging

    from compiled_llm.entrypoints.server.app import serve

    args, opts = engine_args(ns), dataclass_from(ServeArgs, ns)
    cfg = dataclass_from(ServerConfig, ns,
                         model_name=opts.served_model_name or args.model or "demo")
    logging.basicConfig(level=opts.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    if opts.api_server_count > 1:
        from compiled_llm.entrypoints.server.api_servers import serve_many

        return serve_many(args, opts.host, opts.port, cfg, opts.log_level,
                          opts.api_server_count)
    serve(args, opts.host, opts.port, cfg, opts.log_level)
    return 0
