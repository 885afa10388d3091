"""Structural tags (vLLM's structured_outputs.structural_tag, xgrammar's): free text until a
trigger, then the tag's begin, JSON matching its schema, and its end. Checked as a spec, as a
compiled grammar (what its matcher accepts), and constraining an engine's generation."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from compiled_llm import LLM, SamplingParams
from compiled_llm.sample.grammar_compiler import GrammarManager
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.utils import ForceTokens, make_checkpoint, tokenizer_dir

SCHEMA = {"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"],
          "additionalProperties": False}
LEGACY = {"type": "structural_tag", "triggers": ["<tag"],
          "structures": [{"begin": "<tag>", "schema": SCHEMA, "end": "</tag>"}]}
FORMAT = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<tag"], "tags": [
        {"type": "tag", "begin": "<tag>", "content": {"type": "json_schema",
                                                      "json_schema": SCHEMA}, "end": "</tag>"}]}}


@pytest.fixture(scope="module")
def grammars():
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    return GrammarManager(tok, len(tok), (tok.eos_token_id,))


def test_a_structural_tag_is_a_json_object_or_its_text():
    spec = StructuredOutputsParams(structural_tag=json.dumps(LEGACY))
    assert spec.kind == "structural_tag"
    assert SamplingParams(structured_outputs={"structural_tag": LEGACY}).structured_outputs \
        .kind == "structural_tag"
    for bad in ("", "{not json", "[1]", 5, {}):
        with pytest.raises(ValueError, match="structured_outputs.structural_tag"):
            StructuredOutputsParams(structural_tag=bad)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(structural_tag=json.dumps(LEGACY), regex="a")


@pytest.mark.parametrize("tag", [LEGACY, FORMAT], ids=["legacy", "format"])
def test_the_compiled_tag_accepts_free_text_then_schema_json_in_the_tag(grammars, tag):
    spec = StructuredOutputsParams(structural_tag=json.dumps(tag))
    for text, ok in [("any text at all", True),
                     ('Hi <tag>{"a": 1}</tag> and more', True),
                     ('<tag>{"a":2}</tag><tag>{"a": 1}</tag>', True),
                     ('<tag>{"a": 3}</tag>', False),  # not in the enum
                     ('<tag>{"b": 1}</tag>', False),  # not the schema's property
                     ("<tag>free text</tag>", False)]:
        matcher = grammars.matcher(spec)
        assert matcher.accept_string(text) is ok, text


def test_a_bad_structural_tag_is_refused_naming_the_field(grammars):
    for tag in ({"type": "structural_tag", "format": {"type": "nope"}},
                {"type": "structural_tag", "structures": [{"begin": "<t>"}], "triggers": []}):
        spec = StructuredOutputsParams(structural_tag=tag)
        with pytest.raises(ValueError, match="^structured_outputs.structural_tag is invalid"):
            grammars.compile(spec)


def test_generation_after_the_begin_tag_follows_the_schema():
    llm = LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32",
              device="cpu")
    begin = llm.get_tokenizer().encode("<tag>", add_special_tokens=False)
    spec = StructuredOutputsParams(structural_tag=json.dumps(LEGACY))
    params = SamplingParams(temperature=0.0, max_tokens=len(begin) + 12, ignore_eos=True,
                            logits_processors=[ForceTokens(begin)], structured_outputs=spec)
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0].outputs[0]
    assert out.text.startswith("<tag>")
    # the model only ever picked what the grammar allows: a JSON object of the schema after
    # the begin tag (random weights alone would not open one)
    assert out.text[len("<tag>"):].lstrip().startswith("{")
    checker = GrammarManager(llm.get_tokenizer(), llm.engine.inputs.vocab_size, ())
    assert checker.matcher(spec).accept_string(out.text)
    assert llm.engine.num_used_blocks == 0
