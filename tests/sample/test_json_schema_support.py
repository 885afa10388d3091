"""The JSON Schema keywords refused because xgrammar would not enforce them: each one is
really let through by xgrammar's grammar (so refusing is needed), and property names or
enum values that spell a keyword are not mistaken for it."""

from __future__ import annotations

import json

import pytest

from compiled_llm.sample.json_schema_support import loosen_unenforced, unsupported_feature

# (schema, an instance the schema rejects)
UNENFORCED = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1]"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, '"abcdef"'),
    ({"type": "number", "multipleOf": 0.5}, "1.2"),
    ({"not": {"type": "string"}}, '"a"'),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, '{"a":1}'),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "1"),
    ({"type": "object", "propertyNames": {"pattern": "^a"},
      "properties": {"b": {"type": "integer"}}}, '{"b":1}'),
]


@pytest.mark.parametrize("schema, invalid", UNENFORCED)
def test_each_refused_keyword_is_one_xgrammar_lets_through(schema, invalid):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                           separators=(",", ":"))
    assert _is_grammar_accept_string(grammar, invalid)  # the reason for refusing it
    assert unsupported_feature(schema) is not None
    assert unsupported_feature(json.dumps(schema)) is not None


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"not": {"type": "integer"}, "pattern": {"type": "string"},
                                      "maxLength": {"type": "integer"}}, "required": ["not"]},
    {"enum": [{"uniqueItems": True}], "const": {"not": 1}},
    {"type": "integer", "multipleOf": 7, "minimum": 0},
    {"allOf": [{"$ref": "#/$defs/a"}], "description": "pydantic's field wrapper",
     "$defs": {"a": {"type": "string", "maxLength": 3}}},
    {"type": "string", "format": "date"},
    "{not json",  # the compiler names that error
])
def test_what_xgrammar_enforces_passes(schema):
    assert unsupported_feature(schema) is None


def test_the_location_is_named():
    schema = {"$defs": {"t": {"type": "array", "uniqueItems": True}},
              "properties": {"x": {"anyOf": [{"type": "integer"}, {"not": {}}]}}}
    assert unsupported_feature(schema) == "uniqueItems at /$defs/t"
    del schema["$defs"]
    assert unsupported_feature(schema) == "not at /properties/x/anyOf/1"


def test_loosening_drops_only_what_xgrammar_would_not_enforce():
    schema = {"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "uniqueItems": True, "maxItems": 3,
                 "items": {"type": "string", "pattern": "[a-z]+", "maxLength": 4}},
        "uniqueItems": {"type": "boolean"}}}
    loose = loosen_unenforced(schema)
    assert unsupported_feature(loose) is None
    assert loose["properties"]["tags"] == {"type": "array", "maxItems": 3, "items": {
        "type": "string", "pattern": "[a-z]+"}}
    assert loose["properties"]["uniqueItems"] == {"type": "boolean"}  # a name, kept
    assert "uniqueItems" in schema["properties"]["tags"]  # the caller's copy is untouched


@pytest.mark.parametrize("mode, name", [("required", None), ("named", "tag")])
def test_tool_grammars_loosen_rather_than_refuse(mode, name):
    """A tool schema is the client's API description (vLLM enforces it with another backend):
    its grammar drops what xgrammar cannot enforce, so the request is not refused."""
    from compiled_llm.entrypoints.server.tool_calls import ToolPlan

    params = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    tools = [{"type": "function", "function": {"name": "tag", "parameters": params}}]
    spec = ToolPlan(mode=mode, tools=tools, name=name).grammar()
    assert unsupported_feature(spec.json) is None
    assert "uniqueItems" in params["properties"]["tags"]
