"""The FastAPI app of a pooling server (runner pooling): the pooling endpoints, /v1/models,
/tokenize and /detokenize (the generate app's routes), /health, /ping and /metrics (the generate
server's request metrics), the same guards as the generate app, and 400s naming the runner on
the generation routes. app.serve runs it for runner pooling."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM, PoolingTokens
from compiled_llm.entrypoints.server.errors import GuardMiddleware, install_handlers
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.middleware import install_middleware
from compiled_llm.entrypoints.server.openapi import errors, install_openapi, new_app
from compiled_llm.entrypoints.server.protocol import ModelCard, ModelList
from compiled_llm.entrypoints.server.server_config import ServerConfig
from compiled_llm.entrypoints.server.serving import TokenServing
from compiled_llm.entrypoints.server.serving_pooling import (
    GENERATION_PATHS,
    ServingPooling,
    add_pooling_routes,
    refuse_runner_paths,
)
from compiled_llm.entrypoints.server.token_routes import add_token_routes, set_chat_template


def build_pooling_app(engine: AsyncPoolingLLM, cfg: ServerConfig,
                      metrics: ServerMetrics | None = None) -> FastAPI:
    """The app for a pooling engine; metrics: its own registry when None."""
    # request counters and latency only: the engine gauges read a generating engine's stats
    metrics = ServerMetrics(cfg.model_name) if metrics is None else metrics
    app = new_app(cfg.disable_fastapi_docs)
    install_handlers(app)
    install_openapi(app, keyed=cfg.api_key is not None)
    app.add_middleware(GuardMiddleware, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes)
    app.add_middleware(CORSMiddleware, allow_origins=cfg.allowed_origins,
                       allow_methods=cfg.allowed_methods, allow_headers=cfg.allowed_headers,
                       allow_credentials=cfg.allow_credentials)
    install_middleware(app, cfg)
    tokens = TokenServing(PoolingTokens(engine), cfg)
    serving = ServingPooling(engine, cfg.model_name, metrics, cfg.model_names, tokens)
    add_pooling_routes(app, serving)
    set_chat_template(engine, cfg.chat_template)
    add_token_routes(app, tokens)
    refuse_runner_paths(app, GENERATION_PATHS, "pooling")
    created = int(time.time())

    @app.get("/v1/models", responses=errors(400, 401))
    async def models() -> ModelList:
        # as the generate app: every served name, its root the model
        return ModelList(data=[ModelCard(id=name, created=created, root=cfg.model_name,
                                         max_model_len=engine.max_model_len)
                               for name in cfg.model_names])

    async def health() -> Response:
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"], name="health",
                      response_class=Response, responses=errors(400))
    app.add_api_route("/ping", health, methods=["GET", "POST"], name="ping",
                      response_class=Response, responses=errors(400))

    @app.get("/metrics", response_class=PlainTextResponse, responses=errors(400))
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


def pooling_server(args: EngineArgs, cfg: ServerConfig) -> tuple[AsyncPoolingLLM, FastAPI]:
    """The pooling engine for args and its app (serve() runs it with uvicorn)."""
    engine = AsyncPoolingLLM(args)
    return engine, build_pooling_app(engine, cfg)
