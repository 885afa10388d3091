"""`compiled-llm serve`: the OpenAI-compatible HTTP server; its flags come from EngineArgs,
ServeArgs (where to listen) and ServerConfig (the request guards)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass, replace
from typing import Literal

from compiled_llm.config import EngineArgs, check_choices
from compiled_llm.engine.core_prestart import (
    discard,
    discard_servers,
    prestart,
    prestart_servers,
    shared_core_fits,
    start_early_core,
)
from compiled_llm.entrypoints.cli.args import (
    HelpFormatter,
    add_dataclass_args,
    add_engine_args,
    dataclass_from,
    engine_args,
)
from compiled_llm.entrypoints.server.server_config import ServerConfig
from compiled_llm.optimization import SERVE_MAX_NUM_BATCHED_TOKENS
from compiled_llm.parallel_config import shown_model_name

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


@dataclass
class ServeArgs:
    """Where `serve` listens and how it logs."""

    host: str | None = None
    """Address to listen on (default: every IPv4 interface, 0.0.0.0, as vLLM's; give
    127.0.0.1 to accept local connections alone)."""
    port: int = 8000
    """Port to listen on."""
    served_model_name: list[str] | None = None
    """The model's names in the API (default: --model, or 'demo'): replies carry the first,
    a request's model may give any of them, /v1/models lists them all."""
    log_level: LogLevel = "info"
    """Log level of the server and the engine."""
    disable_log_requests: bool = False
    """vLLM's deprecated switch: requests are logged only with --enable-log-requests, and
    this turns that off."""
    disable_frontend_multiprocessing: bool = False
    """vLLM's: run the engine in the API server's process, as --no-engine-core-process does
    (one API server)."""
    api_server_count: int | None = None
    """API-server processes in front of the one engine core process, all on host:port (the
    kernel spreads connections over them); each does its own HTTP, tokenization,
    detokenization and streaming. 1: the server and the front end in this process (default:
    4 on a CUDA device with 16 or more CPU cores, else 1)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0 <= self.port < 1 << 16:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_server_count is not None and self.api_server_count < 1:
            raise ValueError(f"api_server_count must be >= 1, got {self.api_server_count}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `serve`: the engine flags, ServeArgs' and ServerConfig's."""
    parser = subparsers.add_parser("serve", formatter_class=HelpFormatter,
                                   help="serve the OpenAI-compatible HTTP API")
    parser.add_argument("model_tag", nargs="?", metavar="MODEL",
                        help="the model directory, as `vllm serve MODEL` takes it (the same "
                             "as --model)")
    add_engine_args(parser)
    add_dataclass_args(parser, ServeArgs, title="server options")
    # the model's names are derived: --served-model-name, else --model
    add_dataclass_args(parser, ServerConfig, exclude=("model_name", "extra_model_names"),
                       title="request guards")
    parser.set_defaults(func=run_serve)


def take_model_tag(ns: argparse.Namespace) -> None:
    """The positional MODEL into ns.model; ValueError when --model names another."""
    tag = getattr(ns, "model_tag", None)
    if tag is None:
        return
    if ns.model is not None and ns.model != tag:
        raise ValueError(f"model: the positional MODEL {tag!r} and --model {ns.model!r} "
                         "differ; give one of them")
    ns.model = tag


def run_serve(ns: argparse.Namespace) -> int:
    """Build the engine and serve until interrupted."""
    take_model_tag(ns)
    opts = dataclass_from(ServeArgs, ns)
    args = in_process_core(serving_defaults(engine_args(ns)), opts)
    # until the servers install their own: a SIGTERM during start-up still runs the finally
    # below (the processes and directories started ahead are removed)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _prestart_core(args, opts)  # first: its imports overlap the server stack's, below
    try:
        return _serve(ns, args, opts)
    finally:
        discard()  # what was started ahead and serving did not take (refused settings)


def serving_defaults(args: EngineArgs) -> EngineArgs:
    """args with `serve`'s defaults where the user set none: in balanced mode with chunked
    prefill, steps of SERVE_MAX_NUM_BATCHED_TOKENS tokens and piecewise CUDA graphs up to
    them (a pooling engine is built from the user's own args: see _serve)."""
    if (args.max_num_batched_tokens is not None or args.performance_mode != "balanced"
            or not args.enable_chunked_prefill):
        return args
    graphs = args.max_cudagraph_capture_size or SERVE_MAX_NUM_BATCHED_TOKENS
    return replace(args, max_num_batched_tokens=SERVE_MAX_NUM_BATCHED_TOKENS,
                   max_cudagraph_capture_size=graphs)


def in_process_core(args: EngineArgs, opts: ServeArgs) -> EngineArgs:
    """args with the engine core in this process for --disable-frontend-multiprocessing;
    ValueError when --engine-core-process asks for its own process too."""
    if not opts.disable_frontend_multiprocessing:
        return args
    if args.engine_core_process:
        raise ValueError("disable_frontend_multiprocessing runs the engine in the server's "
                         "process; it contradicts --engine-core-process")
    return replace(args, engine_core_process=False)


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(128 + signum)


def server_config(ns: argparse.Namespace, args: EngineArgs, opts: ServeArgs) -> ServerConfig:
    """The ServerConfig of serve's flags (the model's names, request logging derived; no
    --api-key: the key in VLLM_API_KEY, as vLLM's serve reads it)."""
    keys = ns.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY")
                          else None)
    return named_server_config(ns, args, opts.served_model_name, api_key=keys,
                               enable_log_requests=ns.enable_log_requests
                               and not opts.disable_log_requests)


def named_server_config(ns: argparse.Namespace, args: EngineArgs, served_names: list[str] | None,
                        **fields) -> ServerConfig:
    """The ServerConfig of ns's request flags, named served_names (default: the model's) and
    with `fields` set; ValueError for a chat template without a tokenizer."""
    # a model loaded by Hub id is named by the id, not its snapshot directory
    names = list(dict.fromkeys(served_names or [shown_model_name(args.model)
                                                or "demo"]))
    cfg = dataclass_from(ServerConfig, ns, model_name=names[0], extra_model_names=names[1:],
                         **fields)
    if cfg.chat_template is not None and args.skip_tokenizer_init:
        raise ValueError("chat_template: needs a tokenizer (skip_tokenizer_init is set)")
    return cfg


def check_pooling_options(cfg: ServerConfig) -> None:
    """ValueError naming a serve setting the pooling server has no use for yet."""
    for name, value in (("chat_template", cfg.chat_template),
                        ("served_model_name (several names)", cfg.extra_model_names),
                        ("enable_log_requests", cfg.enable_log_requests)):
        if value:
            raise ValueError(f"{name}: not supported by the pooling server (runner pooling)")


def _serve(ns: argparse.Namespace, args, opts: ServeArgs) -> int:
    import logging

    cfg = server_config(ns, args, opts)
    logging.basicConfig(level=opts.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    pooling = _runner(args) == "pooling"
    if pooling:  # a pooling engine runs in this process: the core started ahead goes now
        check_pooling_options(cfg)
        discard()
        args = engine_args(ns)  # with its own token budget, not serving_defaults
    # adapters loaded at run time are known to the API server that loaded them only
    one_server = pooling or (args.enable_lora and _runtime_lora_updates())
    count = opts.api_server_count or (1 if one_server else auto_api_server_count(args))
    if count == 1:  # what was started ahead for several API servers goes now
        discard_servers()
    if count > 1 and one_server:
        raise ValueError("api_server_count > 1 serves generating models only, without runtime "
                         "LoRA updates (runner pooling, VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
    if count > 1:
        from compiled_llm.entrypoints.server.api_servers import serve_many

        return serve_many(args, opts.host, opts.port, cfg, opts.log_level, count)
    # the HTTP stack is imported only here: with several API servers the core's arguments
    # go out first (the servers import it in their own processes)
    from compiled_llm.entrypoints.server.app import serve

    serve(args, opts.host, opts.port, cfg, opts.log_level)
    return 0


def _runtime_lora_updates() -> bool:
    from compiled_llm.entrypoints.server.lora_routes import runtime_updates_allowed

    return runtime_updates_allowed()


def _prestart_core(args, opts: ServeArgs) -> None:
    """Start the engine core's interpreter that serving will most likely ask for (one core
    process of one front end, or the core of several API servers) before anything heavy is
    imported here. The guess costs no torch import; a wrong one only loses the head start.
    For several API servers their interpreters start too, and the core gets its arguments
    (args alone) at once: it loads the model while this process imports and checks."""
    if args.engine_core_process is False:
        return  # the engine runs in this process
    count = opts.api_server_count
    if count is None:  # auto_api_server_count without importing torch to ask for CUDA
        maybe_cuda = args.device.startswith("cuda") or (
            args.device == "auto" and os.path.exists("/dev/nvidiactl"))
        count = 4 if maybe_cuda and (os.cpu_count() or 1) >= 16 else 1
    if count == 1 or not shared_core_fits(args):
        prestart("core_proc")  # as CoreClient starts its own
        return
    start_early_core(args, count)  # each in a session of its own, as serve_many wants them
    prestart_servers(count)


def auto_api_server_count(args) -> int:
    """The default API-server count: 4 where one front-end process is what limits serving (a
    CUDA device, 16+ CPU cores, a generating engine in its own process), else 1. On an H200
    at 256 streams, 4 gave 1.23x the served throughput of 1 (docs/benchmarks.md)."""
    if args.engine_core_process is False:
        return 1
    import torch

    on_cuda = args.device.startswith("cuda") or (args.device == "auto"
                                                 and torch.cuda.is_available())
    return 4 if on_cuda and (os.cpu_count() or 1) >= 16 else 1


def _runner(args) -> str:
    from compiled_llm.engine.llm_engine import DEMO_MODEL
    from compiled_llm.engine.pooling_engine import resolve_runner

    return resolve_runner(args, str(args.model or DEMO_MODEL))
