"""Structured outputs offline: SamplingParams validation, grammars cached by spec, matchers
freed when requests end, and a model vocab larger than the tokenizer's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.sample.grammar_compiler import GrammarManager
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.utils import SMALL, tokenizer_dir

SCHEMA = {"type": "object", "required": ["n", "tags"], "properties": {
    "n": {"type": "integer", "minimum": -5, "maximum": 5},
    "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b", "c"]}}}}
PAD = 64  # model vocab = tokenizer vocab + PAD


@pytest.fixture(scope="module")
def padded_ckpt(tmp_path_factory) -> Path:
    """A tiny Llama whose embedding has PAD ids the tokenizer does not know."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = transformers.LlamaConfig(vocab_size=len(tok) + PAD, eos_token_id=tok.eos_token_id,
                                   bos_token_id=None, **SMALL)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("padded")
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llm(padded_ckpt):
    return LLM(str(padded_ckpt), enforce_eager=True, dtype="float32")


def test_params_validation():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="unknown fields"):
        SamplingParams(structured_outputs={"jsn": {}})
    p = SamplingParams(structured_outputs={"choice": ["x", "y"]})
    assert p.structured_outputs.key() == StructuredOutputsParams(choice=("x", "y")).key()


def test_json_outputs_validate_and_stay_in_tokenizer_vocab(llm):
    vocab = len(llm.get_tokenizer())
    params = SamplingParams(n=8, temperature=1.0, seed=0, max_tokens=120,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    outs = llm.generate(["The quick", "Permission is"], params, use_tqdm=False)
    comps = [c for o in outs for c in o.outputs]
    done = [c for c in comps if c.finish_reason == "stop"]
    assert len(done) >= len(comps) * 3 // 4
    for c in done:
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert all(t < vocab for c in comps for t in c.token_ids)
    assert llm.engine.inputs.grammars.num_cached == 1  # one spec, compiled once for 16 sequences
    assert llm.engine.num_used_blocks == 0


def test_matchers_freed_on_finish_and_abort(llm):
    engine = llm.engine
    spec = StructuredOutputsParams(regex=r"[a-c]{3,40}")
    engine.add_request("done", "The quick", SamplingParams(max_tokens=50, structured_outputs=spec))
    engine.add_request("gone", "The quick", SamplingParams(max_tokens=50, structured_outputs=spec))
    reqs = [engine.scheduler.requests["done"], engine.scheduler.requests["gone"]]
    assert all(r.grammar is not None for r in reqs)
    engine.step()
    engine.abort_request("gone")
    assert reqs[1].grammar is None
    while engine.has_unfinished_requests():
        engine.step()
    assert reqs[0].grammar is None and reqs[0].finish_reason in ("stop", "length")
    assert engine.num_used_blocks == 0


def test_bad_spec_queues_nothing(llm):
    engine = llm.engine
    with pytest.raises(ValueError, match="structured_outputs.json is invalid"):
        engine.add_request("bad", "x", SamplingParams(
            n=3, structured_outputs=StructuredOutputsParams(json={"type": "nope"})))
    assert not engine.has_unfinished_requests() and "bad" not in engine.parents


def test_bitmask_bans_ids_past_the_tokenizer(padded_ckpt):
    from transformers import AutoTokenizer

    from compiled_llm.sample.structured_outputs import fill_bitmask

    tok = AutoTokenizer.from_pretrained(padded_ckpt)
    vocab = len(tok) + PAD
    mgr = GrammarManager(tok, vocab, (tok.eos_token_id,))

    class Req:
        grammar = mgr.matcher(StructuredOutputsParams(json_object=True))

    bitmask, rows = fill_bitmask([Req()], vocab)
    logits = torch.zeros(1, vocab)
    from compiled_llm.sample.structured_outputs import apply_bitmask

    apply_bitmask(logits, bitmask, rows)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and max(allowed) < len(tok)
    assert all(tok.decode([t]).startswith("{") for t in allowed)


def test_vllm_fields_are_taken_and_keyed_by_the_json_they_make():
    spec = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True,
                                   disable_additional_properties=True, whitespace_pattern=r" ?")
    assert spec.key() == StructuredOutputsParams(json=SCHEMA).key()  # compact either way
    loose = StructuredOutputsParams.from_dict({"json": SCHEMA, "any_whitespace": True})
    assert loose.key() != spec.key()
    assert StructuredOutputsParams(json=SCHEMA, any_whitespace=True,
                                   disable_any_whitespace=True).key() == spec.key()
    with pytest.raises(ValueError, match="disable_any_whitespace"):
        StructuredOutputsParams(json=SCHEMA, disable_any_whitespace="yes")
    with pytest.raises(ValueError, match="whitespace_pattern"):
        StructuredOutputsParams(json=SCHEMA, whitespace_pattern=3)
    # vLLM's disable_fallback: one backend, nothing to fall back to; taken, a bool
    assert StructuredOutputsParams.from_dict({"json": SCHEMA, "disable_fallback": True}).key() \
        == spec.key()
    with pytest.raises(ValueError, match="disable_fallback"):
        StructuredOutputsParams(json=SCHEMA, disable_fallback="yes")


@pytest.mark.parametrize("grammar", ['?start: "a" NAME\nNAME: /[b-d]+/',
                                     '// Lark, with a comment holding ::=\nstart: "a" | "b"'])
def test_a_lark_grammar_constrains_as_vllm_takes_it(llm, grammar):
    spec = StructuredOutputsParams(grammar=grammar)
    params = SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=8, structured_outputs=spec)
    for c in llm.generate(["The quick"], params, use_tqdm=False)[0].outputs:
        assert re.fullmatch(r"a[b-d]*|b", c.text), c.text
    assert llm.engine.num_used_blocks == 0


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "[a-z]+",
                                             "maxLength": 3}}}, "minLength/maxLength"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"allOf": [{"type": "integer"}, {"maximum": 5}]}, "allOf"),
])
def test_a_schema_xgrammar_would_not_enforce_is_refused_before_queueing(llm, schema, keyword):
    good = SamplingParams(temperature=0.0, max_tokens=4)
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json=schema))
    with pytest.raises(ValueError, match=f"structured_outputs.json is invalid: {keyword}"):
        llm.generate(["The quick", "The quick"], [good, bad], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests() and llm.engine.num_used_blocks == 0
    assert llm.generate(["The quick"], good, use_tqdm=False)[0].outputs[0].token_ids
