"""ServerConfig: what the HTTP layer enforces around the engine. It imports nothing heavy, so
the CLI can build `serve`'s flags from it without loading the server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    """The served model's name and the guards on every request."""

    model_name: str
    """The model name clients must send; the only model /v1/models lists."""
    api_key: str | None = None
    """Require `Authorization: Bearer KEY` on /v1 routes (default: no key)."""
    max_body_bytes: int = 16 << 20
    """Largest request body accepted, in bytes; larger bodies get 413."""
    trust_request_chat_template: bool = False
    """Render a chat template sent with a request (chat_template, or chat_template_kwargs'
    chat_template); off, such a request gets 400."""
    chat_template_timeout_s: float = 2.0
    """Longest a chat template may render, in seconds; a render past it is interrupted and
    the request gets 400."""
