"""The server's OpenAPI spec made to match what it answers: every error an OpenAI error object
with its real status (400 where FastAPI would document 422), streams as text/event-stream,
/health an empty body, /metrics Prometheus text; with the docs pages beside it unless disabled."""

from __future__ import annotations

import warnings

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from compiled_llm.entrypoints.server.protocol import ErrorResponse

_WHY = {400: "Invalid request (a field, the JSON, a header)", 401: "Missing or wrong API key",
        404: "Unknown model", 413: "Request body too large",
        503: "The engine loop is dead or has stalled"}
STREAM = {200: {"content": {"text/event-stream": {}},
                "description": "The answer: JSON, or server-sent events when stream is true"}}


def errors(*statuses: int) -> dict:
    """The `responses` entries of a route for these error statuses."""
    return {status: {"model": ErrorResponse, "description": _WHY[status]} for status in statuses}


def new_app(disable_docs: bool) -> FastAPI:
    """The server's FastAPI app: /openapi.json, /docs and /redoc unless disable_docs (a proxy's
    root_path is uvicorn's: the spec lists it as the server)."""
    docs = not disable_docs
    return FastAPI(title="compiled-llm", openapi_url="/openapi.json" if docs else None,
                   docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)


def install_openapi(app: FastAPI, keyed: bool) -> None:
    """Serve a spec without FastAPI's 422 validation responses (the app answers 400), errors
    as JSON on every route, and, when keyed, the bearer key on the routes that need it."""
    from compiled_llm.entrypoints.server.errors import needs_key


    def spec() -> dict:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # a route of two methods: its ids are made unique
                warnings.filterwarnings("ignore", "Duplicate Operation ID")
                schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                     servers=app.servers or None)
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    _fix_responses(operation["responses"])
                    if len(operations) > 1:
                        operation["operationId"] = f"{operation['operationId']}_{method}"
                    if keyed and needs_key(path):
                        operation["security"] = [{"bearer": []}]
            components = schema.setdefault("components", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.get("schemas", {}).pop(name, None)
            if keyed:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = spec


def _fix_responses(responses: dict) -> None:
    """No 422; an error documented under the route's media type (text/plain on /metrics)
    moved to application/json, as the error handlers answer it."""
    responses.pop("422", None)
    for status, response in responses.items():
        content = response.get("content", {})
        if int(status) >= 400 and content and "application/json" not in content:
            response["content"] = {"application/json": next(iter(content.values()))}
