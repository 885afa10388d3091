"""Tools on a request, independent of the endpoint: the tools checked, tool_choice resolved
to a ToolPlan (none, auto through the server's parser, required or one named function), the
grammar that enforces required and named calls, and the reply parsed into content and
OpenAI tool calls, whole or streaming. Also the history's tool calls made template input."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.tool_parsers.base import (
    ParsedCall,
    ParsedText,
    ToolCallStreamer,
    ToolParser,
    extract,
)
from compiled_llm.entrypoints.tool_parsers.json_scan import scan_calls
from compiled_llm.sample.json_schema_support import loosen_unenforced
from compiled_llm.sampling_params import StructuredOutputsParams

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI's function names, plus "." and ":"
_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_MAX_DEPTH = 32  # schema nesting checked (deeper is refused, not a recursion error)
Mode = Literal["none", "auto", "required", "named"]


def check_tools(tools: Any, param: str = "tools") -> list[dict[str, Any]] | None:
    """tools, each {"type": "function", "function": {"name", "description"?, "parameters"?}}
    with a distinct name and a JSON-schema object for parameters; a 400 naming the field."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise OpenAIError(400, f"{param} must be a list of tools", param=param)
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or \
                not isinstance(function, dict):
            raise OpenAIError(400, f'{where} must be {{"type": "function", "function": {{...}}}}',
                              param=where)
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise OpenAIError(400, f"{where}.function.name must be 1-64 letters, digits, "
                              f"'_', '-', '.' or ':', got {name!r}", param=f"{where}.function.name")
        if name in names:
            raise OpenAIError(400, f"{where}.function.name {name!r} is given twice",
                              param=f"{where}.function.name")
        names.add(name)
        if "parameters" in function and function["parameters"] is not None:
            _check_schema(function["parameters"], f"{where}.function.parameters", top=True)
    return tools


def _check_schema(schema: Any, where: str, top: bool = False, depth: int = 0) -> None:
    """A 400 unless schema is a JSON schema (an object, or a bool below the top) whose type,
    properties, required, items and *Of parts are well formed, recursively; at the top it
    must describe an object (a function's keyword arguments)."""
    if isinstance(schema, bool) and not top:
        return
    if depth > _MAX_DEPTH:
        raise OpenAIError(400, f"{where} nests more than {_MAX_DEPTH} levels", param=where)
    if not isinstance(schema, dict):
        raise OpenAIError(400, f"{where} must be a JSON schema object", param=where)
    kinds = schema.get("type", "object" if top else None)
    kinds = [] if kinds is None else kinds if isinstance(kinds, list) else [kinds]
    if any(not isinstance(kind, str) or kind not in _SCHEMA_TYPES for kind in kinds) or \
            top and kinds != ["object"]:
        expected = '"object"' if top else "a JSON schema type"
        raise OpenAIError(400, f"{where}.type must be {expected}, got {schema.get('type')!r}",
                          param=where)
    properties, required = schema.get("properties", {}), schema.get("required", [])
    if not isinstance(properties, dict):
        raise OpenAIError(400, f"{where}.properties must be an object", param=where)
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise OpenAIError(400, f"{where}.required must be a list of names", param=where)
    for key, sub in properties.items():
        _check_schema(sub, f"{where}.properties.{key}", depth=depth + 1)
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items", depth=depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        parts = schema.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list) or not parts:
            raise OpenAIError(400, f"{where}.{key} must be a non-empty list", param=where)
        for j, sub in enumerate(parts):
            _check_schema(sub, f"{where}.{key}[{j}]", depth=depth + 1)


@dataclass
class ToolPlan:
    """What a request does with its tools. mode "none" never calls; "auto" parses the reply
    with parser; "required" and "named" are enforced by grammar() (a JSON list of
    {"name", "parameters"} calls, or the named function's arguments)."""

    mode: Mode = "none"
    tools: list[dict[str, Any]] | None = None
    name: str | None = None
    parser: ToolParser | None = None
    parallel: bool = True

    def grammar(self) -> StructuredOutputsParams | None:
        """The constraint enforcing a required or named call (compact JSON: no whitespace
        the model could repeat)."""
        if self.mode == "named":
            return StructuredOutputsParams(json=loosen_unenforced(self._parameters(self.name)))
        if self.mode != "required":
            return None
        defs: dict[str, Any] = {}
        calls = [{"type": "object", "properties": {
            "name": {"type": "string", "enum": [name]},
            "parameters": _hoist_defs(self._parameters(name), defs)},
            "required": ["name", "parameters"]} for name in self._names()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        if defs:  # refs like "#/$defs/X" resolve against the root: the definitions go there
            schema["$defs"] = defs
        # tool schemas are the client's API description: what xgrammar cannot enforce is
        # dropped (vLLM falls back to another backend) rather than the request refused
        return StructuredOutputsParams(json=loosen_unenforced(schema))

    def _names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools or []]

    def _parameters(self, name: str) -> dict[str, Any]:
        function = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return function.get("parameters") or {"type": "object", "properties": {}}

    def parse(self, text: str, final: bool) -> ParsedText:
        """The reply's content and calls as this plan reads them (prefix-stable)."""
        if self.mode == "named":
            return ParsedText("", [ParsedCall(self.name, text, complete=final)])
        if self.mode == "required":
            try:
                pos = text.index("[")
                return ParsedText("", scan_calls(text, pos + 1, final, closer="]",
                                                 argument_keys=("parameters",))[0])
            except ValueError:
                return ParsedText(failed=final)
        if self.mode == "auto":
            parsed = self.parser.parse(text, final)
            if not self.parallel:  # vLLM: parallel_tool_calls=false keeps the first call only
                parsed.calls = parsed.calls[:1]
            return parsed
        return ParsedText(text)

    def extract(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool calls) of a finished reply; "none" keeps the text as it is."""
        return (text, []) if self.mode == "none" else extract(self.parse, text)

    def streamer(self) -> ToolCallStreamer:
        """A streamer of this plan's deltas for one choice."""
        return ToolCallStreamer(self.parse)

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """OpenAI's finish_reason: "tool_calls" once required or auto calls were made; a
        named call keeps the engine's ("stop")."""
        return "tool_calls" if called and self.mode != "named" and reason is not None \
            else reason


def _hoist_defs(parameters: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """parameters without their "$defs" (and draft-07 "definitions"), which go into defs
    under "$defs": nested in the required-call array, a tool's schema is no longer the root
    its "#/$defs/..." refs (pydantic's nested models) point to. The same name defined two
    ways by two tools is a 400."""
    if not any(key in parameters for key in ("$defs", "definitions")):
        return parameters
    for key in ("$defs", "definitions"):
        for name, sub in (parameters.get(key) or {}).items():
            sub = _rewrite_refs(sub)
            if defs.setdefault(name, sub) != sub:
                raise OpenAIError(400, f"tools define {name!r} in {key} twice, differently; "
                                  'tool_choice "required" needs one definition per name',
                                  param="tools")
    rest = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}
    if "definitions" in parameters:  # "#/definitions/X" refs now point into "$defs"
        rest = _rewrite_refs(rest)
    return rest


def _rewrite_refs(schema: Any) -> Any:
    """schema with each "#/definitions/" ref pointing to "#/$defs/" instead."""
    if isinstance(schema, list):
        return [_rewrite_refs(sub) for sub in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: value.replace("#/definitions/", "#/$defs/", 1)
            if key == "$ref" and isinstance(value, str) else _rewrite_refs(value)
            for key, value in schema.items()}


def plan_tools(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None,
               parser_cls: type[ToolParser] | None, auto_enabled: bool) -> ToolPlan:
    """The plan for a request's tools and tool_choice (None: "auto" with tools, as vLLM);
    a 400 naming the field for a bad or unsupported choice."""
    tools = check_tools(tools)
    parallel = parallel_tool_calls is not False
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice == "none":
        return ToolPlan("none", tools)
    if not tools:
        raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
    if tool_choice == "auto":
        if not auto_enabled or parser_cls is None:
            # vLLM's own words, which clients and docs quote
            raise OpenAIError(400, '"auto" tool choice requires --enable-auto-tool-choice '
                              "and --tool-call-parser to be set", param="tool_choice")
        return ToolPlan("auto", tools, parser=parser_cls(tools), parallel=parallel)
    if tool_choice == "required":
        return ToolPlan("required", tools, parallel=parallel)
    return ToolPlan("named", tools, _named(tool_choice, tools), parallel=parallel)


def _named(tool_choice: Any, tools: list[dict[str, Any]]) -> str:
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice == {} or not isinstance(name, str) or tool_choice.get("type") != "function":
        raise OpenAIError(400, 'tool_choice must be "none", "auto", "required" or {"type": '
                          '"function", "function": {"name": ...}}', param="tool_choice")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise OpenAIError(400, f"tool_choice names the function {name!r}, which is not in "
                          "tools", param="tool_choice")
    return name


def history_message(index: int, message: dict[str, Any]) -> dict[str, Any]:
    """A message of the history as template input: its tool calls' arguments (a JSON string
    in OpenAI's format) made dicts, as chat templates read them; a 400 naming the field for a
    malformed call."""
    calls = message.get("tool_calls")
    if calls is None or calls == []:  # a reply echoed back carries [] (vLLM's and ours)
        return {k: v for k, v in message.items() if k != "tool_calls"}
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise OpenAIError(400, f"{where} must be a list of tool calls", param=where)
    return {**message, "tool_calls": [_history_call(f"{where}[{j}]", call)
                                      for j, call in enumerate(calls)]}


def _history_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise OpenAIError(400, f"{where} must be {{\"type\": \"function\", \"function\": "
                          "{\"name\": ..., \"arguments\": ...}}", param=f"{where}.function")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise OpenAIError(400, f"{where}.function.arguments is not valid JSON: {exc}",
                              param=f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise OpenAIError(400, f"{where}.function.arguments must be a JSON object",
                          param=f"{where}.function.arguments")
    return {**call, "type": call.get("type", "function"),
            "function": {**function, "arguments": arguments}}
