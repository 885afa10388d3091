"""OpenAI-style error objects: the exception the handlers raise, the FastAPI exception
handlers that render every failure as `{"error": {message, type, param, code}}`, and the ASGI
guard that answers 400 (headers not UTF-8), 401 (API key, under /v1) and 413 (body size)
before a route."""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from compiled_llm.engine.core_client import EngineDeadError
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from compiled_llm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 500: "server_error", 503: "server_error"}


class OpenAIError(Exception):
    """An error answered with `status` and an OpenAI error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        """The OpenAI error object: {"error": {message, type, param, code}}."""
        kind = _TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a JSON response with its status."""
        return JSONResponse(self.body(), status_code=self.status)


_FIELD = re.compile(r"^([a-z_]+)\b")
_PARAMS = ({f.name for f in dataclasses.fields(SamplingParams)}
           | set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields))


def from_value_error(exc: ValueError) -> OpenAIError:
    """A 400 for a ValueError from validation; its leading field name becomes `param`."""
    msg = str(exc)
    match = _FIELD.match(msg)
    word = match.group(1) if match else None
    param = "prompt" if word == "prompt_token_ids" else word if word in _PARAMS else None
    return OpenAIError(400, msg, param=param, code="invalid_value")


@contextlib.contextmanager
def renamed_params(names: dict[str, str]):
    """A 400 from the shared sampling fields or the engine (a grammar that does not compile,
    too many logprobs) names the field as the endpoint's client sent it: `names` maps what
    the engine calls a field to the endpoint's name."""
    try:
        yield
    except (OpenAIError, ValueError) as exc:
        err = exc if isinstance(exc, OpenAIError) else from_value_error(exc)
        name = names.get(err.param)
        if name is None:
            raise
        message = err.message.replace(err.param, name, 1) if err.param in err.message \
            else f"{name}: {err.message}"
        raise OpenAIError(err.status, message, param=name, code=err.code) from None


def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        msg = f"malformed JSON body: {first.get('ctx', {}).get('error', 'cannot parse')}"
        return OpenAIError(400, msg, code="invalid_json").response()
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "invalid_utf8":  # raised for the whole body: the path is in ctx
        param = first["ctx"]["path"]
        return OpenAIError(400, first["msg"], param=param, code="invalid_utf8").response()
    msg = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error(s))"
    return OpenAIError(400, msg, param=param, code="invalid_type").response()


def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    phrase = HTTPStatus(exc.status_code).phrase
    err = OpenAIError(exc.status_code, str(exc.detail or phrase), code=phrase.lower())
    return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)


def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}").response()


def install_handlers(app: FastAPI) -> None:
    """Every error the app can produce becomes an OpenAI error object."""
    app.add_exception_handler(OpenAIError, lambda _, exc: exc.response())
    app.add_exception_handler(ValueError, lambda _, exc: from_value_error(exc).response())
    app.add_exception_handler(EngineDeadError, lambda _, exc: OpenAIError(
        503, str(exc), code="engine_dead").response())
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


# vLLM's rule: the key guards the OpenAI API under /v1 alone; /health, /metrics, /tokenize,
# the docs pages and every other route are open (as vLLM's AuthenticationMiddleware has it)
KEYED_PREFIX = "/v1"


def needs_key(path: str) -> bool:
    """Whether a route path (root_path removed) needs the API key: it is under /v1."""
    return path.startswith(KEYED_PREFIX)


def route_path(scope) -> str:
    """The request's path as the routes see it: without the root_path prefix that uvicorn puts
    in front of it under --root-path (only a whole leading segment)."""
    path, root = scope["path"], scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


class GuardMiddleware:
    """ASGI: every route under /v1 needs `Authorization: Bearer <key>` for one of api_key
    when keys are (compared in constant time), headers must be UTF-8, and no body may exceed
    max_body_bytes (by Content-Length, or counted as it streams in)."""

    def __init__(self, app, api_key: list[str] | None, max_body_bytes: int) -> None:
        self.app, self.limit = app, max_body_bytes
        self.expected = [f"Bearer {key}".encode() for key in api_key] if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        except UnicodeDecodeError:
            return await _send_error(send, OpenAIError(400, "request headers must be UTF-8",
                                                       code="invalid_header"))
        if not self._authorized(route_path(scope), headers.get("authorization", "")):
            err = OpenAIError(401, "missing or invalid API key (Authorization: Bearer ...)",
                              code="invalid_api_key")
            return await _send_error(send, err)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_error(send, self._too_large())
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._read_capped(receive)
            if body is None:
                return await _send_error(send, self._too_large())
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _authorized(self, path: str, authorization: str) -> bool:
        """Whether the request may reach path: no key set, a path outside /v1, or the right
        key (compare_digest: the time taken says nothing about how much of a guess matched)."""
        if self.expected is None or not needs_key(path):
            return True
        given = authorization.encode()  # every key compared: the time says nothing of which
        return sum(hmac.compare_digest(given, key) for key in self.expected) > 0

    def _too_large(self) -> OpenAIError:
        return OpenAIError(413, f"request body exceeds {self.limit} bytes",
                           code="request_too_large")

    async def _read_capped(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return b"".join(chunks)
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return None
            if not msg.get("more_body"):
                return b"".join(chunks)


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()  # then wait for the disconnect, as the server would
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _send_error(send, err: OpenAIError) -> None:
    payload = json.dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
