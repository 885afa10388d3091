"""The responses /v1/responses keeps (`store`, true unless a request says false, as OpenAI's
default): each finished `response` object with its conversation (input and output as chat
messages, instructions left out, as OpenAI does not carry them over), so that a later request's
previous_response_id continues it and GET / DELETE /v1/responses/{id} find it. In memory, least
recently used first out, bounded by count and by size; nothing survives a restart."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import ChatMessage

MAX_ENTRIES = 1024
MAX_CHARS = 64 << 20  # the stored responses' and conversations' JSON, all together


@dataclass
class Stored:
    """One kept response: its object, its conversation, and its size in characters."""

    response: dict[str, Any]
    conversation: list[ChatMessage]
    size: int


class ResponseStore:
    """Responses by id, least recently used evicted once over max_entries or max_chars."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0

    def _find(self, rid: str, param: str) -> Stored:
        stored = self._items.get(rid)
        if stored is None:  # vLLM's words for an id it does not hold
            raise OpenAIError(
                404, f"Response with id '{rid}' not found.", param=param, code="response_not_found"
            )
        self._items.move_to_end(rid)
        return stored

    def response(self, rid: str) -> dict[str, Any]:
        """The stored response object (a 404 when not kept)."""
        return self._find(rid, "response_id").response

    def conversation(self, rid: str | None) -> list[ChatMessage]:
        """The conversation previous_response_id continues ([] for None; 404 when not
        kept), as copies the new request may extend."""
        if rid is None:
            return []
        return [
            m.model_copy(deep=True) for m in self._find(rid, "previous_response_id").conversation
        ]

    def put(self, rid: str, response: dict[str, Any], conversation: list[ChatMessage]) -> None:
        """Keep response and its conversation, evicting the least recently used as needed
        (one larger than max_chars alone is not kept)."""
        size = len(json.dumps(response)) + sum(len(m.model_dump_json()) for m in conversation)
        if size > self.max_chars:
            return
        self.delete(rid)
        self._items[rid] = Stored(response, conversation, size)
        self._chars += size
        while len(self._items) > self.max_entries or self._chars > self.max_chars:
            _, old = self._items.popitem(last=False)
            self._chars -= old.size

    def delete(self, rid: str) -> bool:
        """Forget rid; whether it was kept."""
        stored = self._items.pop(rid, None)
        if stored is not None:
            self._chars -= stored.size
        return stored is not None


def output_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    """A response's output items as the assistant turn a chat template renders: reasoning
    as reasoning_content, the message as content, function calls as tool_calls (arguments
    cut off mid-JSON, as a response stopped by max_output_tokens leaves them, become {})."""
    reasoning = [
        part["text"] for item in items if item["type"] == "reasoning" for part in item["content"]
    ]
    texts = [
        part["text"] for item in items if item["type"] == "message" for part in item["content"]
    ]
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": _arguments(item["arguments"])},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    if not (reasoning or texts or calls):
        return []
    return [
        ChatMessage(
            role="assistant",
            content="".join(texts) if texts else None,
            reasoning_content="".join(reasoning) if reasoning else None,
            tool_calls=calls or None,
        )
    ]


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
