"""Where function tools meet /v1/responses: the constraint `tools` + `tool_choice` put on the
output, and the output items parsed from the final text. Tool calling is not wired to this
endpoint yet: any tool, a tool choice that needs one, or a tool item in the input is a 400."""

from __future__ import annotations

from typing import Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import ResponseFormat
from compiled_llm.entrypoints.server.protocol_responses import ResponsesRequest

# input item types that carry tool calls and their results
TOOL_ITEM_TYPES = frozenset({"function_call", "function_call_output"})


def tool_constraint(req: ResponsesRequest) -> ResponseFormat | None:
    """The output constraint the request's tools impose (None: none). Invariant: a request
    whose tools this server cannot honour is refused here, naming the field."""
    if req.tools:
        raise OpenAIError(400, "tools: tool calling is not supported on /v1/responses yet",
                          param="tools", code="unsupported_parameter")
    if req.tool_choice not in (None, "none", "auto"):
        raise OpenAIError(400, f"tool_choice: {req.tool_choice!r} needs tools, which "
                          "/v1/responses does not support yet", param="tool_choice",
                          code="unsupported_parameter")
    if req.max_tool_calls is not None:
        raise OpenAIError(400, "max_tool_calls needs tools, which /v1/responses does not "
                          "support yet", param="max_tool_calls", code="unsupported_parameter")
    return None


def tool_input_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A chat message (role, content, tool fields) for a tool item of the input; today a 400
    naming the item, since no tool is accepted."""
    raise OpenAIError(400, f"{where}.type: {item.get('type')!r} items need tools, which "
                      "/v1/responses does not support yet", param=f"{where}.type",
                      code="unsupported_parameter")


def output_items(text: str, message_item) -> list[dict[str, Any]]:
    """The output items of a finished generation: one assistant message (built by
    message_item(text)); function_call items will be parsed out of text here."""
    return [message_item(text)]
