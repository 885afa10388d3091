"""vLLM names a switching user brings along: vLLM <= 0.11's GuidedDecodingParams and
SamplingParams(guided_decoding=...) constrain output as structured_outputs does (both given is
refused), and LLM.preprocess_chat renders what LLM.chat would generate from."""

from __future__ import annotations

import re

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.sampling_params import GuidedDecodingParams, StructuredOutputsParams
from tests.utils import make_chatml_checkpoint


@pytest.fixture(scope="module")
def llm():
    engine = LLM(make_chatml_checkpoint(), enforce_eager=True, dtype="float32", device="cpu")
    yield engine
    assert engine.engine.num_used_blocks == 0


def _guided(**spec) -> SamplingParams:
    with pytest.warns(DeprecationWarning):
        guided = GuidedDecodingParams(**spec)
    with pytest.warns(DeprecationWarning, match="guided_decoding"):
        return SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=12,
                              guided_decoding=guided)


def test_guided_decoding_constrains_as_structured_outputs(llm):
    regex = _guided(regex=r"(cat|dog)[0-9]{2}", backend="xgrammar")
    choice = _guided(choice=["yes", "no way"])
    assert isinstance(regex.structured_outputs, StructuredOutputsParams)
    assert regex.guided_decoding is None and regex.clone().structured_outputs.regex
    outs = llm.generate(["The quick", "The quick"], [regex, choice], use_tqdm=False)
    for c in outs[0].outputs:
        assert re.fullmatch(r"(cat|dog)[0-9]{2}", c.text), c.text
    assert {c.text for c in outs[1].outputs} <= {"yes", "no way"}
    with pytest.warns(DeprecationWarning):  # a dict, as structured_outputs takes one
        as_dict = SamplingParams(guided_decoding={"choice": ["x"]})
    assert as_dict.structured_outputs.choice == ("x",)


def test_guided_decoding_refusals():
    with pytest.raises(ValueError, match="guided_decoding.*structured_outputs"), \
            pytest.warns(DeprecationWarning):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       guided_decoding=GuidedDecodingParams(regex="b"))
    with pytest.raises(ValueError, match="backend"), pytest.warns(DeprecationWarning):
        GuidedDecodingParams(regex="a", backend="outlines")
    with pytest.warns(DeprecationWarning):
        assert GuidedDecodingParams.from_optional() is None
        assert GuidedDecodingParams.from_optional(regex="a").regex == "a"


def test_preprocess_chat_is_what_chat_generates_from(llm):
    convs = [[{"role": "user", "content": "hello"}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]
    prompts = llm.preprocess_chat(convs)
    tok = llm.get_tokenizer()
    assert [p["prompt"] for p in prompts] == [
        tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in convs]
    assert prompts[0]["prompt_token_ids"] == tok.encode(prompts[0]["prompt"],
                                                        add_special_tokens=False)
    assert llm.preprocess_chat(convs[0]) == prompts[:1]  # one conversation
    params = SamplingParams(temperature=0, max_tokens=4)
    chat = llm.chat(convs, params, use_tqdm=False)
    gen = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in chat] == [o.outputs[0].token_ids for o in gen]
    assert [o.prompt for o in chat] == [p["prompt"] for p in prompts]
    cont = llm.preprocess_chat(convs[0], add_generation_prompt=False,
                               continue_final_message=True)
    assert cont[0]["prompt"].endswith("hello")
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.preprocess_chat(convs[0], mm_processor_kwargs={"x": 1})
