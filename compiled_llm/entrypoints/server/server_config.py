"""ServerConfig: what the HTTP layer enforces around the engine. It imports nothing heavy, so
the CLI can build `serve`'s flags from it without loading the server."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

UvicornLogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
# vLLM's rule: a value that opens as a file is a path; else, holding one of these, a template
_JINJA_CHARS = "{}\n"


def listen_host(host: str | None) -> str:
    """The address a server binds: host, or every IPv4 interface for None (vLLM's default)."""
    return "0.0.0.0" if host is None else host


def load_chat_template(value: str) -> str:
    """The template --chat-template names, read as vLLM reads it: a file, else the text itself."""
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the value
        if any(c in value for c in _JINJA_CHARS):
            return value
        raise ValueError(f"chat_template: {value!r} looks like a file path, but it could not "
                         f"be opened ({e})") from None


@dataclass
class ServerConfig:
    """The served model's names and the guards on every request."""

    model_name: str
    """The model name replies carry, and one a request's model may give; /v1/models lists it."""
    api_key: list[str] | None = None
    """Require `Authorization: Bearer KEY`, any of these keys, on every route under /v1 (after
    --root-path), as vLLM does; /tokenize, /health, /metrics and the other routes stay open
    (one string: that key; default: none, or serve's VLLM_API_KEY)."""
    max_body_bytes: int = 16 << 20
    """Largest request body accepted, in bytes; larger bodies get 413."""
    max_completion_prompts: int = 1024
    """Most prompts in one /v1/completions request (vLLM's default); more get 400."""
    trust_request_chat_template: bool = False
    """Render a chat template sent with a request (chat_template, or chat_template_kwargs'
    chat_template); off, such a request gets 400."""
    chat_template_timeout_s: float = 2.0
    """Longest a chat template may render, in seconds; a render past it is interrupted and
    the request gets 400."""
    engine_iteration_timeout_s: float = 60.0
    """/health answers 503 once the engine loop has made no progress for this long, in
    seconds, while it has work (vLLM's VLLM_ENGINE_ITERATION_TIMEOUT_S)."""
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    """CORS: origins a browser may call the API from (vLLM's default: any)."""
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    """CORS: methods allowed from those origins (default: any)."""
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    """CORS: request headers allowed from those origins (default: any)."""
    allow_credentials: bool = False
    """CORS: let browsers send credentials (cookies, HTTP auth) cross-origin."""
    enable_force_include_usage: bool = False
    """End every stream with a usage chunk, as if its stream_options asked for it."""
    return_tokens_as_token_ids: bool = False
    """Show every token of logprobs as "token_id:{id}" (a request's own field does it for
    that request)."""
    disable_fastapi_docs: bool = False
    """Serve no OpenAPI spec (/openapi.json), Swagger UI (/docs) or ReDoc (/redoc)."""
    root_path: str | None = None
    """The path prefix a path-routing proxy serves this server under (FastAPI's root_path)."""
    otlp_traces_endpoint: str | None = None
    """Send an OpenTelemetry `llm_request` span per request to this OTLP endpoint (gRPC, or
    http/protobuf by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL), as vLLM does; needs the `otel`
    extra (default: no tracing)."""
    timeout_graceful_shutdown: float = 10.0
    """On SIGTERM, seconds requests in flight get to finish before they are cut off and the
    server exits (a stuck engine included)."""
    enable_auto_tool_choice: bool = False
    """Let the model decide whether to call tools (tool_choice "auto", the default when a
    request has tools); its reply is read by --tool-call-parser."""
    tool_call_parser: str | None = None
    """How the model writes tool calls, by vLLM's parser names (hermes, llama3_json,
    mistral, qwen3_coder, pythonic, openai ...; an unknown name is refused with the list
    of known ones)."""
    reasoning_parser: str | None = None
    """How the model marks its thinking (vLLM's names: deepseek_r1, deepseek_v3, ernie45,
    gemma4, glm45, granite, hunyuan_a13b, minimax_m2, minimax_m2_append_think, mistral, olmo3,
    openai_gptoss, qwen3, seed_oss): the span goes to reasoning_content, and structured
    outputs and tool grammars start after it. A gpt-oss model takes openai_gptoss unless
    another is named."""
    response_role: str = "assistant"
    """The role of a chat reply that follows a generation prompt (without one, the reply
    continues the last message and takes its role)."""
    lora_modules: list[str] | None = None
    """LoRA adapters to serve (with --enable-lora), each `name=path` or a JSON object
    {"name": ..., "path": ...}; a request's model selects one by name."""
    enable_log_requests: bool = False
    """Log each generation request at INFO as it is admitted: its id, prompt token ids,
    sampling parameters and LoRA adapter (vLLM's --enable-log-requests)."""
    uvicorn_log_level: UvicornLogLevel | None = None
    """Log level of uvicorn, the HTTP server (default: --log-level)."""
    extra_model_names: list[str] = field(default_factory=list)
    """Further names a request's model may give for the same model (--served-model-name's
    after the first); /v1/models lists them too."""
    chat_template: str | None = None
    """The chat template of chat requests that send none (default: the tokenizer's): a file
    path, or the template itself (a value holding {, } or a newline), as vLLM takes it."""
    chat_template_content_format: Literal["auto", "string", "openai"] = "auto"
    """How a message's content reaches the chat template: a string (string), OpenAI's list of
    text parts (openai), or (auto, vLLM's detection) parts where the template reads only
    parts, else a string."""
    enable_prompt_tokens_details: bool = False
    """Put usage.prompt_tokens_details.cached_tokens (prompt tokens served from the prefix
    cache) in completion and chat responses, as vLLM's flag does."""
    max_log_len: int | None = None
    """The most prompt token ids a request logged by --enable-log-requests shows (the log
    prints ids, not text; default: all)."""
    enable_request_id_headers: bool = False
    """Answer every request with an X-Request-Id header: the request's own, else a new id."""
    middleware: list[str] | None = field(default=None, metadata={"repeat": True})
    """An ASGI middleware class or an `async def (request, call_next)` function added to the
    app, by import path (package.module.name); give the flag once per middleware."""
    ssl_keyfile: str | None = None
    """The TLS private key file (with --ssl-certfile: the server speaks HTTPS)."""
    ssl_certfile: str | None = None
    """The TLS certificate file: the server speaks HTTPS."""
    ssl_ca_certs: str | None = None
    """The CA certificates file client certificates are checked against."""
    ssl_cert_reqs: int = 0
    """Whether a client certificate is required: 0 no, 1 optional, 2 required (Python's
    ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED)."""

    def __post_init__(self) -> None:
        from compiled_llm.config_fields import check_choices
        from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
        from compiled_llm.entrypoints.tool_parsers import check_tool_parser

        if self.tool_call_parser is not None:
            check_tool_parser(self.tool_call_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser")
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)
        check_choices(self)
        if isinstance(self.api_key, str):
            self.api_key = [self.api_key]
        if self.api_key is not None and not (self.api_key and all(self.api_key)):
            raise ValueError("api_key: give at least one key, none of them empty")
        if self.chat_template is not None:  # the text from here on, read once at start
            self.chat_template = load_chat_template(self.chat_template)
        self._check_http()

    def _check_http(self) -> None:
        """ValueError naming max_log_len, middleware or an ssl_* field set wrong."""
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"max_log_len must be >= 0, got {self.max_log_len}")
        for path in self.middleware or ():
            if "." not in path.strip("."):
                raise ValueError(f"middleware: {path!r} is not an import path (module.name)")
        if self.ssl_cert_reqs not in (0, 1, 2):
            raise ValueError(f"ssl_cert_reqs must be 0, 1 or 2, got {self.ssl_cert_reqs}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{name}: no such file {path!r}")

    @property
    def model_names(self) -> list[str]:
        """Every name the model is served under, model_name first."""
        return [self.model_name, *self.extra_model_names]
