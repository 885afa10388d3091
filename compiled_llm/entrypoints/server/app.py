"""The FastAPI app: routes, error handling and guards around one AsyncLLM; `serve()` runs it
with uvicorn (what `compiled-llm serve` calls)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from compiled_llm.config import EngineArgs
from compiled_llm.engine.llm_engine import DEMO_MODEL
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.server.compat_routes import add_compat_routes
from compiled_llm.entrypoints.server.errors import (
    GuardMiddleware,
    OpenAIError,
    install_handlers,
)
from compiled_llm.entrypoints.server.lora_routes import ServedLoRAs, add_lora_routes
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.middleware import install_middleware
from compiled_llm.entrypoints.server.openapi import STREAM, errors, install_openapi, new_app
from compiled_llm.entrypoints.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.server_config import ServerConfig, listen_host
from compiled_llm.entrypoints.server.serving_chat import ServingChat
from compiled_llm.entrypoints.server.serving_completion import ServingCompletion
from compiled_llm.entrypoints.server.serving_pooling import POOLING_PATHS, refuse_runner_paths
from compiled_llm.entrypoints.server.serving_responses import ServingResponses
from compiled_llm.entrypoints.server.token_routes import add_token_routes, set_chat_template
from compiled_llm.entrypoints.server.tracing import TraceHeadersMiddleware

if TYPE_CHECKING:
    from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM

__all__ = ["ServerConfig", "build_app", "build_server", "serve"]


def build_app(engine: AsyncLLM, cfg: ServerConfig, metrics: ServerMetrics,
              shared_dir: str | None = None) -> FastAPI:
    """The app for engine; metrics must be the engine's observer. shared_dir: a directory
    the API server processes of one engine share (stored responses live there)."""
    app = new_app(cfg.disable_fastapi_docs)
    install_handlers(app)
    install_openapi(app, keyed=cfg.api_key is not None)
    app.add_middleware(GuardMiddleware, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes)
    if cfg.otlp_traces_endpoint is not None:
        app.add_middleware(TraceHeadersMiddleware)
    # added last, so outermost: a browser's preflight is answered without the key
    app.add_middleware(CORSMiddleware, allow_origins=cfg.allowed_origins,
                       allow_methods=cfg.allowed_methods, allow_headers=cfg.allowed_headers,
                       allow_credentials=cfg.allow_credentials)
    install_middleware(app, cfg)
    metrics.bind(engine)
    set_chat_template(engine, cfg.chat_template)
    loras = ServedLoRAs(engine, cfg.model_name, cfg.lora_modules)
    chat, completion = ServingChat(engine, cfg, metrics), ServingCompletion(engine, cfg, metrics)
    store_dir = None if shared_dir is None else os.path.join(shared_dir, "responses")
    responses = ServingResponses(engine, cfg, metrics, store_dir=store_dir)
    for serving in (chat, completion, responses):
        serving.loras = loras
    _add_generation_routes(app, chat, completion, metrics)
    add_lora_routes(app, loras)
    _add_responses_routes(app, responses, metrics)
    _add_probe_routes(app, engine, cfg, metrics)
    add_token_routes(app, chat)
    add_compat_routes(app, chat)
    refuse_runner_paths(app, POOLING_PATHS, "generate")
    return app


def _add_generation_routes(app: FastAPI, chat: ServingChat, completion: ServingCompletion,
                           metrics: ServerMetrics) -> None:
    answers = {**STREAM, **errors(400, 401, 404, 413)}

    @app.post("/v1/chat/completions", responses=answers)
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        return await _counting(metrics, chat.create(req, raw))

    @app.post("/v1/completions", responses=answers)
    async def completions(req: CompletionRequest, raw: Request):
        return await _counting(metrics, completion.create(req, raw))

    created = int(time.time())

    @app.get("/v1/models", responses=errors(400, 401))
    async def models() -> ModelList:
        bases = [ModelCard(id=name, created=created, max_model_len=chat.max_model_len,
                           root=chat.model_path) for name in chat.cfg.model_names]
        adapters = [ModelCard(id=name, created=created, max_model_len=chat.max_model_len,
                              root=lora.lora_path, parent=chat.model_name)
                    for name, lora in chat.loras.adapters.items()]
        return ModelList(data=[*bases, *adapters])


def _add_responses_routes(app: FastAPI, responses: ServingResponses,
                          metrics: ServerMetrics) -> None:
    """POST /v1/responses; GET and DELETE of a stored response by id."""

    @app.post("/v1/responses", responses={**STREAM, **errors(400, 401, 404, 413)})
    async def create_response(req: ResponsesRequest, raw: Request):
        return await _counting(metrics, responses.create(req, raw))

    async def stored_response(response_id: str, raw: Request):
        found = (responses.delete if raw.method == "DELETE" else responses.retrieve)(response_id)
        return JSONResponse(found)

    # one route, so that a 405 lists both methods in Allow
    app.add_api_route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"],
                      name="stored_response", responses=errors(401, 404))


def _add_probe_routes(app: FastAPI, engine: AsyncLLM, cfg: ServerConfig,
                      metrics: ServerMetrics) -> None:
    """/health and /ping (an empty 200 while the engine serves), /metrics; no key needed."""

    async def health() -> Response:
        # 503 when the engine loop is dead, or has made no progress for
        # engine_iteration_timeout_s while it has work
        if engine.error is not None:
            raise OpenAIError(503, f"engine loop is dead: {engine.error}")
        stalled = engine.stalled_for()
        if stalled > cfg.engine_iteration_timeout_s:
            raise OpenAIError(503, f"engine loop has made no progress for {stalled:.1f} s "
                              "with work pending", code="engine_stalled")
        return Response(status_code=200)

    probe = {"response_class": Response, "responses": errors(400, 503)}
    app.add_api_route("/health", health, methods=["GET"], name="health", **probe)
    # vLLM's alias of /health; one route, so that a 405 lists both methods in Allow
    app.add_api_route("/ping", health, methods=["GET", "POST"], name="ping", **probe)

    @app.get("/metrics", response_class=PlainTextResponse, responses=errors(400))
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)


async def _counting(metrics: ServerMetrics, work):
    """Await a handler; a 4xx it raises counts as a rejected request."""
    try:
        return await work
    except OpenAIError as e:
        if 400 <= e.status < 500 and e.status != 499:
            metrics.rejected()
        raise
    except ValueError:
        metrics.rejected()
        raise


def serve(args: EngineArgs, host: str | None, port: int, cfg: ServerConfig,
          log_level: str = "info") -> None:
    """Build the engine and serve until interrupted (a pooling engine for runner pooling)."""
    import uvicorn

    from compiled_llm.core.gc_heap import freeze_startup_heap

    engine, app = build_server(args, cfg)
    freeze_startup_heap()  # this process is the server's own
    try:
        uvicorn.Server(uvicorn_config(app, host, port, cfg, log_level)).run()
    finally:
        engine.shutdown()


def build_server(args: EngineArgs,
                 cfg: ServerConfig) -> tuple[AsyncLLM | AsyncPoolingLLM, FastAPI]:
    """(engine, app) for args: a pooling engine and its app for runner pooling, else an AsyncLLM
    and build_app's (what serve() runs, and `compiled-llm run-batch` calls in process)."""
    from compiled_llm.engine.pooling_engine import resolve_runner

    if resolve_runner(args, str(args.model or DEMO_MODEL)) == "pooling":
        from compiled_llm.entrypoints.server.pooling_app import pooling_server

        return pooling_server(args, cfg)
    metrics = ServerMetrics(cfg.model_name)
    engine = AsyncLLM(args, observer=metrics)
    return engine, build_app(engine, cfg, metrics)


def uvicorn_config(app: FastAPI, host: str | None, port: int, cfg: ServerConfig,
                   log_level: str = "info", **options):
    """How uvicorn serves app on host (None: every IPv4 interface, vLLM's default): SIGTERM
    gives requests in flight timeout_graceful_shutdown seconds, then cuts them off (uvicorn
    alone would wait for them forever); it logs at cfg.uvicorn_log_level, else log_level;
    HTTPS with cfg's ssl_* files. options go to uvicorn.Config as they are."""
    import uvicorn

    return uvicorn.Config(app, host=listen_host(host), port=port,
                          log_level=cfg.uvicorn_log_level or log_level,
                          timeout_keep_alive=30, root_path=cfg.root_path or "",
                          timeout_graceful_shutdown=cfg.timeout_graceful_shutdown,
                          ssl_keyfile=cfg.ssl_keyfile, ssl_certfile=cfg.ssl_certfile,
                          ssl_ca_certs=cfg.ssl_ca_certs, ssl_cert_reqs=cfg.ssl_cert_reqs,
                          **options)
