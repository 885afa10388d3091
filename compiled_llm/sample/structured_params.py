"""Structured outputs' parameters (``StructuredOutputsParams``, vLLM's, and vLLM <= 0.11's
``GuidedDecodingParams`` / ``guided_decoding=``), and the UTF-8 check every text field of a
request passes. Pure Python, in sampling_params' layer (which re-exports them): the scheduler
reads them without importing torch."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, fields
from typing import Any

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def check_text(name: str, text: str) -> str:
    """text, or ValueError naming the field when it is not valid UTF-8 (a lone surrogate
    such as "\\ud800", which JSON can spell, has no UTF-8 encoding)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid UTF-8 text, got a lone surrogate at "
                         f"character {exc.start}") from None
    return text


def _schema_text(schema: str | dict) -> str:
    if isinstance(schema, str):
        return schema
    try:
        return json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"structured_outputs.json must be a JSON object: {exc}") from None


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of json (a JSON schema, dict or str), regex, choice, grammar (EBNF),
    json_object=True or structural_tag (vLLM's: xgrammar's structural tag as a JSON string,
    legacy {"structures", "triggers"} or {"format"}). Whitespace between JSON tokens is off
    unless any_whitespace=True: a compact form that a weak model cannot pad forever."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict | None = None
    any_whitespace: bool = False
    reasoning_end_token_id: int | tuple[int, ...] | None = None
    """When set, the reply starts in a thinking span: nothing is constrained until this token
    (or this token sequence: the span's end) is generated, and the grammar applies from the
    token after it."""
    disable_any_whitespace: bool = False
    """vLLM's: JSON without whitespace between tokens (wins over any_whitespace)."""
    disable_additional_properties: bool = False
    """vLLM's: objects take no property their schema does not declare. Always so here
    (xgrammar's strict mode) unless the schema itself allows additionalProperties."""
    whitespace_pattern: str | None = None
    """vLLM's (its outlines backend's): taken and not applied, as vLLM's xgrammar backend
    does; the JSON is compact, or any_whitespace's."""
    disable_fallback: bool = False
    """vLLM's: no fallback to another backend for what xgrammar cannot compile. Taken and
    moot: xgrammar is the only backend, so a grammar it refuses is a 400 either way."""

    def __post_init__(self) -> None:
        set_kinds = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise ValueError("structured_outputs: give exactly one of json, regex, choice, "
                             f"grammar, json_object or structural_tag, got "
                             f"{set_kinds or 'none'}")
        self._check_types()

    def _check_types(self) -> None:
        if self.json is not None:
            if not isinstance(self.json, (str, dict)):
                raise ValueError("structured_outputs.json must be a JSON schema (object or "
                                 "string)")
            check_text("structured_outputs.json", _schema_text(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
            if value is not None:
                check_text(f"structured_outputs.{name}", value)
        if self.choice is not None:
            self._check_choice()
        if self.structural_tag is not None:
            _check_structural_tag(self.structural_tag)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError("structured_outputs.json_object must be a bool")
        for name in ("any_whitespace", "disable_any_whitespace",
                     "disable_additional_properties", "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"structured_outputs.{name} must be a bool, got "
                                 f"{getattr(self, name)!r}")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError(f"structured_outputs.whitespace_pattern must be a string or None, "
                             f"got {self.whitespace_pattern!r}")
        end_id = self.reasoning_end_token_id
        if isinstance(end_id, list):
            end_id = tuple(end_id)
            object.__setattr__(self, "reasoning_end_token_id", end_id)
        ids = end_id if isinstance(end_id, tuple) else (end_id,)
        if end_id is not None and not (ids and all(map(_is_token_id, ids))):
            raise ValueError(f"structured_outputs.reasoning_end_token_id must be a token id "
                             f"or a non-empty sequence of them, got {end_id!r}")

    def _check_choice(self) -> None:
        # a bare string is a sequence of characters: refused, never split into choices
        choice = self.choice
        if (not isinstance(choice, (list, tuple)) or not choice
                or not all(isinstance(c, str) and c for c in choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of "
                             "non-empty strings")
        for text in choice:
            check_text("structured_outputs.choice", text)
        object.__setattr__(self, "choice", tuple(choice))

    @property
    def kind(self) -> str:
        """The one constraint given: "json", "regex", "choice", "grammar", "json_object" or
        "structural_tag"."""
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    @property
    def json_any_whitespace(self) -> bool:
        """Whether JSON may have whitespace between its tokens: any_whitespace=True, unless
        disable_any_whitespace. Compact by default (vLLM allows any): a weak model cannot pad
        the JSON with whitespace until max_tokens cuts it."""
        return self.any_whitespace and not self.disable_any_whitespace

    def key(self) -> tuple[str, str, bool]:
        """A hashable identity of the grammar this spec compiles to."""
        value = getattr(self, self.kind)
        if isinstance(value, (dict, tuple)):
            value = json.dumps(value, sort_keys=True)
        return self.kind, str(value), self.json_any_whitespace

    @classmethod
    def coerce(cls, value: Any, guided: Any = None) -> StructuredOutputsParams | None:
        """SamplingParams.structured_outputs from what it was given (params, a dict of fields
        or None) and guided_decoding, vLLM <= 0.11's name of it (the same forms); ValueError
        for anything else, and naming both when both are given."""
        if guided is not None:
            if value is not None:
                raise ValueError("guided_decoding is the old name of structured_outputs: give "
                                 "one of them, not both")
            warnings.warn("SamplingParams(guided_decoding=...) is vLLM's old name of "
                          "structured_outputs=...", DeprecationWarning, stacklevel=5)
            value = guided
        if isinstance(value, dict):
            return cls.from_dict(value)
        if value is not None and not isinstance(value, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be StructuredOutputsParams, got {value!r}")
        return value

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> StructuredOutputsParams:
        """Build from a dict of fields; ValueError on an unknown field."""
        if not isinstance(spec, dict):
            raise ValueError(f"structured_outputs must be a dict of fields, got {spec!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted((name for name in spec if name not in known), key=repr)
        if unknown:  # sorted by repr: the keys may be of any type
            raise ValueError(f"structured_outputs: unknown fields {unknown}")
        return cls(**spec)


@dataclass(frozen=True)
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM <= 0.10's name of StructuredOutputsParams (0.11 kept it, deprecated; 0.12 dropped
    it): the same fields, and its per-request backend (None, "auto" or "xgrammar", the one
    backend here; others are refused by name)."""

    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn("GuidedDecodingParams is vLLM's old name of StructuredOutputsParams; "
                      "use StructuredOutputsParams", DeprecationWarning, stacklevel=3)
        if self.backend not in (None, "auto", "xgrammar"):
            raise ValueError(f"guided_decoding.backend {self.backend!r} is not supported: "
                             "xgrammar is the one structured-output backend (auto picks it)")
        super().__post_init__()

    @classmethod
    def from_optional(cls, json: Any = None, regex: str | None = None,
                      choice: list[str] | None = None, grammar: str | None = None,
                      json_object: bool | None = None,
                      **kwargs: Any) -> GuidedDecodingParams | None:
        """vLLM's: None when no constraint is given, else the params."""
        if all(v is None for v in (json, regex, choice, grammar, json_object)):
            return None
        return cls(json=json, regex=regex, choice=choice, grammar=grammar,
                   json_object=json_object, **kwargs)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _check_structural_tag(tag: Any) -> None:
    """ValueError naming structured_outputs.structural_tag unless it is a JSON object (a
    dict, or its text); what xgrammar makes of it is checked when it compiles."""
    name = "structured_outputs.structural_tag"
    if isinstance(tag, str):
        check_text(name, tag)
        try:
            tag = json.loads(tag)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    elif isinstance(tag, dict):
        try:
            json.dumps(tag, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(tag, dict) or not tag:
        raise ValueError(f"{name} must be a non-empty JSON object (or its text), as xgrammar's "
                         "structural tag")
