"""The app's optional middleware, as vLLM's serve adds it: the X-Request-Id response header
(--enable-request-id-headers) and the user's own (--middleware: an ASGI middleware class or
an `async def (request, call_next)` function, by import path)."""

from __future__ import annotations

import importlib
import inspect
import uuid

from fastapi import FastAPI

from compiled_llm.entrypoints.server.server_config import ServerConfig

REQUEST_ID = b"x-request-id"


class RequestIdHeaderMiddleware:
    """ASGI: every HTTP response carries X-Request-Id, the request's own header else a new
    id (vLLM's --enable-request-id-headers); streamed responses too, from their first byte."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((value for key, value in scope["headers"] if key.lower() == REQUEST_ID),
                     None)
        request_id = given or uuid.uuid4().hex.encode()

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ())
                           if k.lower() != REQUEST_ID]
                message = {**message, "headers": [*headers, (REQUEST_ID, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def imported_middleware(path: str):
    """The object `package.module.name` names; ValueError naming middleware when it cannot be
    imported or is neither a class nor an async function."""
    module_name, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"middleware: cannot import {path!r} ({type(e).__name__}: {e})") \
            from None
    if not (inspect.isclass(found) or inspect.iscoroutinefunction(found)):
        raise ValueError(f"middleware: {path!r} must be an ASGI middleware class or an "
                         "async function (request, call_next)")
    return found


def install_middleware(app: FastAPI, cfg: ServerConfig) -> None:
    """cfg's optional middleware, outside the app's own (added last, so outermost): the
    request-id header, then the user's, in the order given (the last one outermost)."""
    if cfg.enable_request_id_headers:
        app.add_middleware(RequestIdHeaderMiddleware)
    for path in cfg.middleware or ():
        found = imported_middleware(path)
        if inspect.isclass(found):
            app.add_middleware(found)
        else:
            app.middleware("http")(found)
