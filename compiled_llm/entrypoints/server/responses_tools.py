"""Function tools and reasoning on /v1/responses, on chat's machinery (tool_calls.py, reply.py):
Responses' flat tools and tool_choice made chat-shaped for the template and the ToolPlan, the
combinations refused by name, and a finished reply made output items (reasoning, message,
function calls); its count of thinking tokens is reply.py's reasoning_token_count."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import ResponseFormat
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest
from compiled_llm.entrypoints.server.reply import ReplyFormat
from compiled_llm.entrypoints.server.responses_items import (
    LOGPROBS_INCLUDE,
    function_call_item,
    message_item,
    reasoning_item,
)
from compiled_llm.entrypoints.server.tool_calls import ToolPlan

_CHOICES = ("none", "auto", "required")
_CHOICE_SHAPE = 'tool_choice must be "none", "auto", "required" or {"type": "function", ' \
    '"name": ...}'
_CHAT_FIELD = re.compile(r"(tools\[\d+\])\.function\b")  # chat's spelling of a tool's field


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses' function tools ({"type": "function", "name", "description", "parameters",
    "strict"}) in chat's shape ({"type": "function", "function": {...}}); a 400 naming
    tools[i] for a tool that is not an object or not a function (no built-in tool runs here)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise OpenAIError(400, "tools must be a list of tools", param="tools")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise OpenAIError(400, f"tools[{i}] must be an object", param=f"tools[{i}]")
        if tool.get("type") != "function":
            raise OpenAIError(400, f"tools[{i}].type: {tool.get('type')!r} tools are not "
                              "supported; this server runs no built-in tool, only function "
                              "tools", param=f"tools[{i}].type", code="unsupported_parameter")
        function = {key: value for key, value in tool.items() if key != "type"}
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(tool_choice: Any) -> Any:
    """tool_choice in chat's shape: a named function {"type": "function", "name"} becomes
    {"type": "function", "function": {"name"}}; any other object or string is a 400."""
    if tool_choice is None or tool_choice in _CHOICES:
        return tool_choice
    name = tool_choice.get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise OpenAIError(400, f"{_CHOICE_SHAPE}, got {tool_choice!r}", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def responses_plan(req: ResponsesRequest,
                   tool_plan: Callable[[Any, Any, bool | None], ToolPlan]) -> ToolPlan:
    """The request's ToolPlan, resolved by tool_plan (the server's, chat's rules: "auto" needs
    --enable-auto-tool-choice); a 400 names the field as Responses spells it."""
    if req.max_tool_calls is not None:
        raise OpenAIError(400, "max_tool_calls limits built-in tool calls, and this server "
                          "runs no built-in tool", param="max_tool_calls",
                          code="unsupported_parameter")
    tools, choice = chat_tools(req.tools), chat_tool_choice(req.tool_choice)
    try:
        plan = tool_plan(tools, choice, req.parallel_tool_calls)
    except OpenAIError as exc:
        param = _CHAT_FIELD.sub(r"\1", exc.param or "")
        raise OpenAIError(exc.status, _CHAT_FIELD.sub(r"\1", exc.message),
                          param=param or None, code=exc.code) from None
    _check_logprobs(req, plan)
    return plan


def _check_logprobs(req: ResponsesRequest, plan: ToolPlan) -> None:
    """Logprobs belong to the message's output_text; a reply that may be a function call has
    none to give them to, so the two are refused together."""
    if plan.mode == "none":
        return
    param = "include" if LOGPROBS_INCLUDE in (req.include or ()) else "top_logprobs" \
        if req.top_logprobs is not None else None
    if param is not None:
        raise OpenAIError(400, f"{param}: output_text logprobs are not available with "
                          f'tool_choice "{plan.mode}" (the reply may be a function call)',
                          param=param, code="unsupported_parameter")


def check_tool_format(plan: ToolPlan, fmt: ResponseFormat | None) -> None:
    """A 400 for text.format together with a required or named call (each is a grammar)."""
    if fmt is not None and plan.grammar() is not None:
        raise OpenAIError(400, f'tool_choice "{plan.mode}" is enforced by a grammar; it cannot '
                          "be combined with text.format", param="tool_choice")


def tool_names(plan: ToolPlan) -> set[str]:
    """The names of the request's function tools."""
    return {tool["function"]["name"] for tool in plan.tools or ()}


def output_items(reply: ReplyFormat, text: str, finish_reason: str | None, status: str,
                 logprobs: list | None) -> list[dict[str, Any]]:
    """The output items of a finished reply, as OpenAI orders them: its reasoning, the
    assistant message (left out when the reply is only function calls), each call."""
    message, _ = reply.message(text, finish_reason)
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(f"rs_{uuid.uuid4().hex}", message["reasoning_content"],
                                    status))
    calls = message.get("tool_calls") or []
    if message["content"] is not None or not calls:
        items.append(message_item(f"msg_{uuid.uuid4().hex}", message["content"] or "", status,
                                  logprobs))
    items += [function_call_item(call["function"]["name"], call["function"]["arguments"],
                                 "completed") for call in calls]
    return items
