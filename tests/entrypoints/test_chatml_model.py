"""A chat model as fine-tunes ship them (tests/utils.make_chatml_checkpoint): generation stops
at the tokenizer's EOS and the config's alike, special added tokens leave no text unless
asked for, and a chat output's prompt is the rendered conversation."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_chatml_checkpoint

IM_END, ENDOFTEXT, IM_START = 2, 0, 3


@pytest.fixture(scope="module")
def llm():
    engine = LLM(make_chatml_checkpoint(), enforce_eager=True, dtype="float32", device="cpu")
    yield engine
    assert engine.engine.num_used_blocks == 0


def _forced(token: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=5, logit_bias={token: 100.0}, **kw)


@pytest.mark.parametrize("eos", [IM_END, ENDOFTEXT])
def test_both_eos_ids_stop(llm, eos):
    out = llm.generate(["hello"], _forced(eos), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop"
    ignored = llm.generate(["hello"], _forced(eos, ignore_eos=True), use_tqdm=False)
    assert ignored[0].outputs[0].token_ids == [eos] * 5


def test_special_added_tokens_leave_no_text(llm):
    skipped = llm.generate(["hello"], _forced(IM_START), use_tqdm=False)[0].outputs[0]
    assert skipped.token_ids == [IM_START] * 5 and skipped.text == ""
    kept = llm.generate(["hello"], _forced(IM_START, skip_special_tokens=False),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == "<|im_start|>" * 5


def test_a_chat_output_carries_its_rendered_prompt(llm):
    out = llm.chat([{"role": "user", "content": "hi"}], _forced(IM_END), use_tqdm=False)[0]
    assert out.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert out.outputs[0].finish_reason == "stop"
