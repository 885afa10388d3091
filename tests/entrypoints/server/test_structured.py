"""Structured outputs through the server at temperature 1: every completed output parses and
validates against its JSON schema (jsonschema), matches its regex, or is one of the choices;
a structural tag's tagged JSON follows its schema."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from transformers import AutoTokenizer

from compiled_llm.sample.grammar_compiler import GrammarManager
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.entrypoints.server.conftest import API_KEY

SCHEMAS = {
    "person": {"type": "object", "required": ["name", "age", "ok"], "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"}}},
    "digits": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "minItems": 1, "maxItems": 4},
    "enum_tags": {"type": "object", "required": ["color", "tags"], "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 4}}}},
    "nested": {"type": "object", "required": ["p", "z"], "properties": {
        "p": {"type": "object", "required": ["x", "y"],
              "properties": {"x": {"type": "number"}, "y": {"type": "integer"}}},
        "z": {"type": ["string", "null"], "maxLength": 5}}},
}


def _complete(choices, text=lambda c: c.message.content):
    done = [text(c) for c in choices if c.finish_reason == "stop"]
    assert len(done) >= len(choices) * 3 // 4, [c.finish_reason for c in choices]
    return done


@pytest.mark.parametrize("name", SCHEMAS)
def test_json_schema_outputs_validate(client, server, name):
    schema = SCHEMAS[name]
    r = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "JSON please"}], n=8,
        temperature=1.0, seed=11, max_tokens=160,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
    for text in _complete(r.choices):
        jsonschema.validate(json.loads(text), schema)


def test_guided_json_streamed(client, server):
    schema = SCHEMAS["person"]
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in client.completions.create(model=server.model, prompt="x", n=4, seed=3,
                                           temperature=1.0, max_tokens=160, stream=True,
                                           extra_body={"guided_json": schema}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    done = [texts[i] for i in texts if reasons[i] == "stop"]
    assert len(done) >= 3
    for t in done:
        jsonschema.validate(json.loads(t), schema)


def test_json_object_parses(client, server):
    r = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "x"}], n=16, seed=5,
        temperature=1.0, max_tokens=200, response_format={"type": "json_object"})
    done = [c.message.content for c in r.choices if c.finish_reason == "stop"]
    assert done  # a random model may write long strings; what finishes must be an object
    assert all(isinstance(json.loads(t), dict) for t in done)


def test_regex_choice_and_grammar(client, server):
    pattern = r"[a-z]{1,6}@[a-z]{2,5}\.(com|org)"
    kw = dict(model=server.model, prompt="x", n=8, seed=1, temperature=1.0, max_tokens=60)
    r = client.completions.create(**kw, extra_body={"guided_regex": pattern})
    assert all(re.fullmatch(pattern, t) for t in _complete(r.choices, lambda c: c.text))
    choices = ["yes", "no", "maybe not"]
    r = client.completions.create(**kw, extra_body={"structured_outputs": {"choice": choices}})
    assert all(c.finish_reason == "stop" and c.text in choices for c in r.choices)
    grammar = 'root ::= "(" expr ")"\nexpr ::= [0-9] | [0-9] "+" expr'
    r = client.completions.create(**kw, extra_body={"guided_grammar": grammar})
    assert all(re.fullmatch(r"\(\d(\+\d)*\)", t) for t in _complete(r.choices, lambda c: c.text))


TAG_SCHEMA = {"type": "object", "required": ["a"], "properties": {"a": {"enum": [1, 2]}},
              "additionalProperties": False}
TAG = {"type": "tag", "begin": "<tag>", "end": "</tag>",
       "content": {"type": "json_schema", "json_schema": TAG_SCHEMA}}
LEGACY = {"type": "structural_tag", "triggers": ["<tag"],
          "structures": [{"begin": "<tag>", "schema": TAG_SCHEMA, "end": "</tag>"}]}


def test_structural_tag_constrains_the_tagged_json(client, server):
    # xgrammar's format: here the reply is one tag, its content JSON of the schema
    r = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "x"}], n=4, seed=2,
        temperature=1.0, max_tokens=60,
        response_format={"type": "structural_tag", "format": TAG})
    assert all(c.message.content.startswith("<tag>{") for c in r.choices)
    for text in (c.message.content for c in r.choices if c.finish_reason == "stop"):
        assert text.endswith("</tag>")
        jsonschema.validate(json.loads(text[len("<tag>"):-len("</tag>")]), TAG_SCHEMA)
    # vLLM's legacy form: free text, and the schema's JSON inside any tag a trigger opens
    tokenizer = AutoTokenizer.from_pretrained(server.model)
    grammars = GrammarManager(tokenizer, len(tokenizer), ())
    spec = StructuredOutputsParams(structural_tag=json.dumps(LEGACY))
    for extra in ({"response_format": LEGACY}, {"structured_outputs": {"structural_tag":
                                                                      json.dumps(LEGACY)}}):
        r = client.completions.create(model=server.model, prompt="The quick <", n=4, seed=4,
                                      temperature=1.0, max_tokens=40, extra_body=extra)
        assert all(grammars.matcher(spec).accept_string(c.text) for c in r.choices)


@pytest.mark.parametrize("response_format, param", [
    ({"type": "structural_tag", "triggers": ["<t"]}, "response_format"),
    ({"type": "structural_tag", "format": {"type": "nope"}}, "structured_outputs")])
def test_a_bad_structural_tag_is_a_400(server, response_format, param):
    r = httpx.post(f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": server.model, "prompt": "x", "max_tokens": 2,
                         "response_format": response_format}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
