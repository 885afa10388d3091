"""The responses /v1/responses keeps (`store`: true unless a request says false, as OpenAI's),
each with its conversation (instructions left out, as OpenAI does), for previous_response_id
and GET / DELETE /v1/responses/{id}. In memory, least recently used out first, bounded by count
and size; with several API server processes, as files in a directory they share (any of them
may get the next request). Nothing survives a restart."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import ChatMessage

MAX_ENTRIES = 1024
MAX_CHARS = 64 << 20  # the stored responses' and conversations' JSON, all together
FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # ids this server makes; others are not kept


@dataclass
class Stored:
    """One kept response: its object, its conversation, and its size in characters."""

    response: dict[str, Any]
    conversation: list[ChatMessage]
    size: int


class ResponseStore:
    """Responses by id, least recently used evicted once over max_entries or max_chars."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS,
                 directory: str | None = None) -> None:
        """directory: shared with the other API server processes (None: one process)."""
        self.max_entries, self.max_chars, self.directory = max_entries, max_chars, directory
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0
        if directory is not None:
            os.makedirs(directory, exist_ok=True)

    def _find(self, rid: str, param: str) -> Stored:
        # shared: the files are the truth (another process may have deleted or kept it)
        stored = self._items.get(rid) if self._path(rid) is None else self._read(rid)
        if stored is None:  # vLLM's words for an id it does not hold
            raise OpenAIError(
                404, f"Response with id '{rid}' not found.", param=param, code="response_not_found"
            )
        if rid in self._items:
            self._items.move_to_end(rid)
        return stored

    def _path(self, rid: str) -> str | None:
        if self.directory is None or not FILE_ID.fullmatch(rid):
            return None
        return os.path.join(self.directory, f"{rid}.json")

    def _read(self, rid: str) -> Stored | None:
        """A response another API server process kept (None: not there)."""
        path = self._path(rid)
        if path is None:
            return None
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        conversation = [ChatMessage.model_validate(m) for m in data["conversation"]]
        return Stored(data["response"], conversation, 0)

    def _write(self, rid: str, response: dict[str, Any], conversation: list[ChatMessage]) -> None:
        """Publish a kept response to the other processes (written whole, then renamed)."""
        path = self._path(rid)
        if path is None:
            return
        data = {"response": response,
                "conversation": [m.model_dump(mode="json") for m in conversation]}
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)

    def _unlink(self, rid: str) -> bool:
        path = self._path(rid)
        if path is None:
            return False
        try:
            os.unlink(path)
        except OSError:
            return False
        return True

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
        self._write(rid, response, conversation)
        while len(self._items) > self.max_entries or self._chars > self.max_chars:
            old_rid, old = self._items.popitem(last=False)  # each process evicts what it kept
            self._chars -= old.size
            self._unlink(old_rid)

    def delete(self, rid: str) -> bool:
        """Forget rid (in every process sharing the directory); whether it was kept."""
        stored = self._items.pop(rid, None)
        if stored is not None:
            self._chars -= stored.size
        return self._unlink(rid) or stored is not None


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
