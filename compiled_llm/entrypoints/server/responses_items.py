"""The shapes of /v1/responses: its input (a string, message items, function calls and their
outputs) as chat messages for the chat template, the refusal of fields it cannot honour (a 400
naming each), text.format as a response_format, and the `response` object and its items."""

from __future__ import annotations

import time
import uuid
from typing import Any

from compiled_llm.entrypoints.chat_utils import REASONING_EFFORTS, join_text_parts
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import ChatMessage, JsonSchemaFormat, ResponseFormat
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.tool_calls import history_message

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ROLES = ("user", "system", "developer", "assistant")
TOOL_ITEM_TYPES = frozenset({"function_call", "function_call_output"})
_TEXT_PARTS = ("input_text", "output_text")
_NO_CONVERSATIONS = "conversation objects are not supported; continue a response with " \
    "previous_response_id, or send the whole conversation in input"
# (field, whether the request sets it to something not honoured, why)
_REFUSED = (
    ("conversation", lambda r: r.conversation is not None, _NO_CONVERSATIONS),
    ("background", lambda r: bool(r.background), "background responses are not supported"),
    ("prompt", lambda r: r.prompt is not None, "stored prompt templates are not supported"),
    ("truncation", lambda r: r.truncation == "auto",
     "truncation 'auto' is not supported; an input over the context is a 400"),
    ("reasoning", lambda r: any(v is not None for k, v in (r.reasoning or {}).items()
                                if k != "effort"),
     "reasoning summaries are not supported; reasoning.effort reaches the chat template "
     "(as chat completions' reasoning_effort), the reasoning text comes from "
     "--reasoning-parser"),
    ("reasoning.effort", lambda r: reasoning_effort(r) not in (None, *REASONING_EFFORTS),
     f"must be one of {', '.join(REASONING_EFFORTS)}"),
    ("text.verbosity", lambda r: r.text is not None and r.text.verbosity is not None,
     "verbosity is not supported"),
    ("response_format", lambda r: r.response_format is not None,
     "response_format belongs to chat completions; /v1/responses takes text.format"),
    ("n", lambda r: r.n != 1, "/v1/responses makes one output; n must be 1"),
)


def reasoning_effort(req: ResponsesRequest) -> str | None:
    """reasoning.effort of a Responses request (None when unset)."""
    return (req.reasoning or {}).get("effort")


def check_supported(req: ResponsesRequest) -> None:
    """A 400 naming the first field set to something this server does not honour."""
    for field, refused, why in _REFUSED:
        if refused(req):
            raise OpenAIError(400, f"{field}: {why}", param=field, code="unsupported_parameter")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise OpenAIError(400, f"top_logprobs must be in [0, 20], got {req.top_logprobs}",
                          param="top_logprobs", code="invalid_value")
    for i, value in enumerate(req.include or ()):
        if value != LOGPROBS_INCLUDE:
            raise OpenAIError(400, f"include[{i}]: {value!r} is not supported; only "
                              f"{LOGPROBS_INCLUDE!r}", param="include",
                              code="unsupported_parameter")


def messages(req: ResponsesRequest, tool_names: set[str],
             previous: list[ChatMessage] | None = None) -> list[ChatMessage]:
    """The chat messages for the template: instructions as a leading system message, the
    previous response's conversation, then input (a string is one user message);
    function_call items join the assistant turn before them, function_call_output items
    become tool messages (answering a call of input or of the previous conversation)."""
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else \
        req.input
    if not items:
        raise OpenAIError(400, "input must be a non-empty string or list of items",
                          param="input")
    history = [ChatMessage(role="system", content=req.instructions)] if req.instructions \
        else []
    history += previous or []
    call_ids = {call["id"] for m in previous or () for call in m.tool_calls or ()}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise OpenAIError(400, f"{where}.type must be a string, got {kind!r}",
                              param=f"{where}.type")
        if kind in TOOL_ITEM_TYPES:
            _add_tool_item(history, item, where, tool_names, call_ids)
        elif kind == "reasoning":
            history.append(ChatMessage(role="assistant", content=None,
                                       reasoning_content=_reasoning_text(item, where)))
        else:
            _add_message(history, _message(item, kind, where))
    return history


def _add_message(history: list[ChatMessage], message: ChatMessage) -> None:
    """message appended; an assistant message right after a reasoning item (an agent sends
    back the output items it got: reasoning, then the message) joins that turn."""
    last = history[-1] if history else None
    if message.role == "assistant" and last is not None and last.role == "assistant" and \
            last.content is None and not last.tool_calls:
        last.content = message.content
    else:
        history.append(message)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thinking, for the assistant turn's reasoning_content: its
    reasoning_text parts, else its summary_text parts (vLLM reads either); encrypted
    reasoning (OpenAI's own models) cannot be read here."""
    if item.get("encrypted_content") is not None:
        raise OpenAIError(400, f"{where}.encrypted_content: encrypted reasoning is not "
                          "supported", param=f"{where}.encrypted_content",
                          code="unsupported_parameter")
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
            raise OpenAIError(400, f"{where}.{key} must be a list of text parts",
                              param=f"{where}.{key}")
        if parts:
            return join_text_parts(p["text"] for p in parts)
    return ""


def _message(item: dict[str, Any], kind: str, where: str) -> ChatMessage:
    if kind != "message":
        raise OpenAIError(400, f"{where}.type: {kind!r} input items are not supported",
                          param=f"{where}.type", code="unsupported_parameter")
    role = item.get("role")
    if role not in _ROLES:
        raise OpenAIError(400, f"{where}.role must be one of {list(_ROLES)}, got {role!r}",
                          param=f"{where}.role")
    return ChatMessage(role=role, content=_content(item.get("content"), f"{where}.content"))


def _add_tool_item(history: list[ChatMessage], item: dict[str, Any], where: str,
                   tool_names: set[str], call_ids: set[str]) -> None:
    """A function_call appended to the assistant turn (a new one unless the last message is
    the assistant's); a function_call_output as the tool message answering call_id, which
    an earlier function_call must have made."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise OpenAIError(400, f"{where}.call_id must be a non-empty string",
                          param=f"{where}.call_id")
    if item["type"] == "function_call_output":
        if call_id not in call_ids:
            raise OpenAIError(400, f"{where}.call_id {call_id!r} answers no earlier "
                              "function_call item of input", param=f"{where}.call_id")
        output = _content(item.get("output"), f"{where}.output")
        history.append(ChatMessage(role="tool", tool_call_id=call_id, content=output))
        return
    if call_id in call_ids:
        raise OpenAIError(400, f"{where}.call_id {call_id!r} is given twice",
                          param=f"{where}.call_id")
    call_ids.add(call_id)
    call = _history_call(item, call_id, where, tool_names)
    if history and history[-1].role == "assistant":
        history[-1].tool_calls = [*(history[-1].tool_calls or []), call]
    else:
        history.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _history_call(item: dict[str, Any], call_id: str, where: str,
                  tool_names: set[str]) -> dict[str, Any]:
    """A function_call item as a chat tool call, its arguments checked (and made a dict)
    by chat's history_message; its name must be one of the request's tools."""
    name = item.get("name")
    if name not in tool_names:
        raise OpenAIError(400, f"{where}.name: {name!r} is not the name of a function in "
                          "tools", param=f"{where}.name")
    call = {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": item.get("arguments", "{}")}}
    try:
        return history_message(0, {"tool_calls": [call]})["tool_calls"][0]
    except OpenAIError as exc:
        message = exc.message.replace("messages[0].tool_calls[0].function", where)
        raise OpenAIError(400, message, param=f"{where}.arguments") from None


def _content(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of input_text/output_text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"{where} must be a string or a list of content parts",
                          param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise OpenAIError(400, f"{where}[{j}].type: {kind!r} content is not supported "
                              f"(only {list(_TEXT_PARTS)})", param=f"{where}[{j}].type",
                              code="unsupported_parameter")
        if not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"{where}[{j}].text must be a string",
                              param=f"{where}[{j}].text")
        texts.append(part["text"])
    return join_text_parts(texts)


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """text.format as the chat endpoint's response_format (None for free text)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.schema_ is None:
        raise OpenAIError(400, "text.format.schema is required for type 'json_schema'",
                          param="text.format.schema")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=fmt.name or "schema", description=fmt.description, schema=fmt.schema_,
        strict=fmt.strict))


def message_item(item_id: str, text: str, status: str, logprobs: list | None) -> dict:
    """An assistant `message` output item holding one output_text part."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if status == "in_progress" else [part]}


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A `reasoning` output item holding the thinking span as one reasoning_text part."""
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content,
            "status": status}


def function_call_item(name: str, arguments: str, status: str,
                       ids: tuple[str, str] | None = None) -> dict:
    """A `function_call` output item; ids is (item id, call_id), fresh when not given."""
    item_id, call_id = ids or new_call_ids()
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def new_call_ids() -> tuple[str, str]:
    """A fresh (item id, call_id) pair for a function_call item."""
    token = uuid.uuid4().hex
    return f"fc_{token}", f"call_{token}"


def response_usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict:
    """The Responses `usage` object (no prefix-cache split is counted); output_tokens
    includes the reasoning_tokens."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def response_object(req: ResponsesRequest, rid: str, model: str, created: int, *,
                    status: str, output: list, usage: dict | None = None,
                    error: dict | None = None) -> dict:
    """The `response` object; incomplete_details says why when status is "incomplete"."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) \
        if req.text is not None and req.text.format is not None else {"type": "text"}
    done = status in ("completed", "incomplete")
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "completed_at": int(time.time()) if done else None, "error": error,
            "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": model, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": None,
            "store": req.store is not False,
            "temperature": req.temperature, "top_p": req.top_p, "text": {"format": fmt},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "top_logprobs":
            req.top_logprobs, "truncation": "disabled", "metadata": req.metadata or {},
            "background": False, "usage": usage, "user": req.user}
