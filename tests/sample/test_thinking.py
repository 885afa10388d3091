"""A thinking span before a constrained reply, offline: the grammar waits for the span's end
token (ReasoningGate), and the thinking budget forces that token once spent."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.sample.thinking_budget import ThinkingBudget
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.entrypoints.server.tool_model import tool_checkpoint

SCHEMA = {"type": "object", "required": ["n"], "properties": {
    "n": {"type": "integer", "minimum": 0, "maximum": 9}}}


@pytest.fixture(scope="module")
def llm():
    return LLM(str(tool_checkpoint()), enforce_eager=True, dtype="float32")


def _end_id(llm) -> int:
    return llm.get_tokenizer().convert_tokens_to_ids("</think>")


@pytest.mark.parametrize("budget", [0, 2, 5])
def test_budget_then_grammar(llm, budget):
    """Each reply thinks at most `budget` tokens, then the JSON after </think> validates."""
    end = _end_id(llm)
    params = SamplingParams(
        n=6, temperature=1.0, seed=budget, max_tokens=80,
        structured_outputs=StructuredOutputsParams(json=SCHEMA, reasoning_end_token_id=end),
        logits_processors=[ThinkingBudget(budget, end, None, open_in_prompt=True)])
    [out] = llm.generate([[5, 6, 7]], params)
    for completion in out.outputs:
        assert end in completion.token_ids[:budget + 1]
        after = completion.token_ids[completion.token_ids.index(end) + 1:]
        assert completion.finish_reason == "stop"
        text = llm.get_tokenizer().decode(after, skip_special_tokens=True)
        jsonschema.validate(json.loads(text), SCHEMA)


def test_budget_counts_from_the_start_tag():
    """Not open in the prompt: no forcing unless the reply opens with the start tag."""
    budget = ThinkingBudget(2, end_token_id=3, start_token_id=1, open_in_prompt=False)
    logits = torch.zeros(5)
    assert torch.equal(budget([4, 4], logits), logits)
    forced = budget([1, 4, 4], logits)
    assert forced.argmax() == 3 and torch.isinf(forced[:3]).all()
    assert torch.equal(budget([1, 3, 4], logits), logits)  # ended on its own
    with pytest.raises(ValueError, match="thinking_token_budget"):
        ThinkingBudget(-1, 3, None, True)


class _Force:
    """A logits processor that forces ids as the reply's tokens at..at+len(ids)-1 (a class:
    a CUDA engine's core runs in its own process, so processors are pickled)."""

    def __init__(self, ids: tuple[int, ...], at: int) -> None:
        self.ids, self.at = ids, at

    def __call__(self, output_ids, logits):
        step = len(output_ids) - self.at
        if 0 <= step < len(self.ids):
            keep = logits[self.ids[step]].clone()
            logits.fill_(float("-inf"))
            logits[self.ids[step]] = keep
        return logits


def test_grammar_waits_for_an_end_token_sequence(llm):
    """An end of several tokens (gpt-oss's <|channel|>final<|message|>) opens the grammar
    only once all of them came in a row: the first alone does not."""
    end = (11, 12)
    params = SamplingParams(
        n=3, temperature=1.0, seed=7, max_tokens=60,
        structured_outputs=StructuredOutputsParams(json=SCHEMA, reasoning_end_token_id=list(end)),
        logits_processors=[_Force((11,), 1), _Force(end, 3)])
    [out] = llm.generate([[5, 6, 7]], params)
    for completion in out.outputs:
        assert tuple(completion.token_ids[3:5]) == end
        text = llm.get_tokenizer().decode(completion.token_ids[5:], skip_special_tokens=True)
        jsonschema.validate(json.loads(text), SCHEMA)
