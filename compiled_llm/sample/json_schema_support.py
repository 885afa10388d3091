"""JSON Schema keywords xgrammar (the only grammar backend here) compiles without enforcing,
so outputs would silently fail validation: refused before a request is queued, as vLLM's
xgrammar backend does (its "auto" falls back to a backend this engine does not have).
loosen_unenforced drops them instead, for the grammars the server derives from tool
definitions. Pure Python (no xgrammar import)."""

from __future__ import annotations

import copy
import json
from typing import Any

# keywords that change nothing about which instances are valid
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$id", "$schema", "$anchor"})
# keys beside allOf that constrain nothing in the same node
_NOT_SIBLINGS = frozenset({"allOf", "$defs", "definitions"})
# Found on the xgrammar this package pins: uniqueItems and contains are dropped, a pattern or
# format drops minLength/maxLength, a non-integer multipleOf, not, dependentRequired and allOf
# beside other constraints are ignored, propertyNames is ignored next to declared properties.
# array keywords whose constraint is dropped
_ARRAY_DROPPED = ("uniqueItems", "contains", "minContains", "maxContains")
# where subschemas sit: maps of name -> schema, lists of schemas, single schemas
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "additionalItems", "if", "then",
                         "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems"})


def unsupported_feature(schema: Any) -> str | None:
    """A description of the first keyword in schema (a dict, or its JSON text) that xgrammar
    would not enforce, with its location ("uniqueItems at /properties/tags"); None when every
    keyword is enforced, or when the text is not JSON (the compiler reports that)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None
    return _walk(schema, "")


def loosen_unenforced(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of schema without the keywords xgrammar would not enforce: the grammar it
    compiles to is the one xgrammar made of schema anyway, now without refusal (for grammars
    the server derives from tool definitions, where vLLM falls back to a backend that
    enforces them and a refusal would fail a request that works there)."""
    schema = copy.deepcopy(schema)
    while (found := _find(schema, "")) is not None:
        node, keys, _ = found
        for key in keys:
            node.pop(key, None)
    return schema


def _walk(node: Any, path: str) -> str | None:
    """The first unenforced keyword in the schema at path or in its subschemas."""
    found = _find(node, path)
    return None if found is None else found[2]


def _find(node: Any, path: str) -> tuple[dict[str, Any], tuple[str, ...], str] | None:
    """(the schema object, the keys to drop from it, a description) of the first unenforced
    keyword at path or below."""
    if not isinstance(node, dict):
        return None
    found = _check_node(node)
    if found:
        keys, what = found
        return node, keys, f"{what} at {path or '/'}"
    for sub, sub_path in _subschemas(node, path):
        hit = _find(sub, sub_path)
        if hit:
            return hit
    return None


def _subschemas(node: dict[str, Any], path: str):
    """(subschema, its path) for each subschema of node: property names and enum/const
    values are data, never walked as schemas."""
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield sub, f"{path}/{key}/{name}"
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield sub, f"{path}/{key}/{i}"
        elif key in _SCHEMA_ONE:
            yield value, f"{path}/{key}"


def _check_node(node: dict[str, Any]) -> tuple[tuple[str, ...], str] | None:
    """(the keys to drop, a description) of one schema object's unenforced keyword."""
    for key in (*_ARRAY_DROPPED, "not", "dependentRequired"):
        if key in node:
            return (key,), key
    if _string_bounds_dropped(node):
        return ("minLength", "maxLength"), "minLength/maxLength beside pattern or format"
    multiple = node.get("multipleOf")
    if multiple is not None and (not _is_whole(multiple) or "number" in _types(node)):
        return ("multipleOf",), ("multipleOf on a number (only integers with a whole "
                                 "multipleOf are enforced)")
    names = node.get("propertyNames")
    if isinstance(names, dict) and (
            "properties" in node or "patternProperties" in node
            or isinstance(node.get("additionalProperties"), dict)):
        return ("propertyNames",), ("propertyNames beside properties, patternProperties or "
                                    "additionalProperties")
    if isinstance(names, dict) and _string_bounds_dropped(names):
        return ("propertyNames",), ("propertyNames with minLength/maxLength beside pattern "
                                    "or format")
    pattern_props = node.get("patternProperties")
    if isinstance(pattern_props, dict) and ("properties" in node or len(pattern_props) > 1):
        return ("patternProperties",), ("patternProperties beside properties, or more than "
                                        "one of them")
    all_of = node.get("allOf")
    if isinstance(all_of, list) and (len(all_of) > 1 or set(node) - _ANNOTATIONS - _NOT_SIBLINGS):
        return ("allOf",), "allOf with more than one schema, or beside other keywords"
    return None


def _string_bounds_dropped(node: dict[str, Any]) -> bool:
    return ("pattern" in node or "format" in node) and (
        "minLength" in node or "maxLength" in node)


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
