"""A bounded hypothesis run over SamplingParams: any values at all either raise a ValueError
(never another exception) or make params that the engine refuses with a ValueError or runs
through model steps without an error, its blocks back in the pool."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint

BIG = 2 ** 70
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-BIG, BIG), st.integers(-3, 600),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                    st.sampled_from(["\ud800", "", "a\udfffb"]))
ANYTHING = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.integers(-2, 600), st.text(max_size=4)), inner, max_size=3)),
    max_leaves=8)
IDS = st.lists(st.integers(0, 400), max_size=3)  # the test model's vocabulary is 384
WORDS = st.text(min_size=1, max_size=3)
# per field, valid values, edges included (ANYTHING brings the invalid ones)
NEAR = {
    "n": st.integers(1, 5), "temperature": st.floats(0.0, 3.0),
    "top_p": st.floats(0.0, 1.0, exclude_min=True),
    "top_k": st.one_of(st.integers(-1, 400), st.just(2 ** 31 - 1)), "min_p": st.floats(0, 1),
    "seed": st.integers(-(2 ** 63), 2 ** 63 - 1), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.01, 3),
    "stop_token_ids": IDS, "allowed_token_ids": IDS.filter(bool),
    "logit_bias": st.dictionaries(st.integers(0, 400), st.floats(-100, 100), max_size=3),
    "max_tokens": st.one_of(st.none(), st.integers(1, 4)), "min_tokens": st.integers(0, 4),
    "logprobs": st.one_of(st.none(), st.integers(0, 25)),
    "prompt_logprobs": st.one_of(st.none(), st.integers(0, 25)),
    "stop": st.one_of(st.none(), WORDS, st.lists(WORDS, max_size=2)),
    **{name: st.booleans() for name in ("ignore_eos", "detokenize", "skip_special_tokens",
                                         "spaces_between_special_tokens",
                                         "include_stop_str_in_output")},
    "structured_outputs": st.sampled_from([
        None, {"choice": ["yes", "no"]}, {"regex": "[ab]{1,3}"}, {"json_object": True},
        {"choice": "abc"}, {"json_object": True, "any_whitespace": "yes"},
        {"grammar": "root ::= ("}, {"json": {"type": "object"}, "any_whitespace": True}]),
}
FIELDS = sorted(f.name for f in dataclasses.fields(SamplingParams)
                if f.name not in ("logits_processors", "output_kind"))


def _value(name: str):
    near = NEAR.get(name)  # mostly near the valid range, sometimes anything at all
    return ANYTHING if near is None else st.one_of(near, near, near, ANYTHING)


KWARGS = st.lists(st.sampled_from(FIELDS), max_size=5, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: _value(name) for name in names}))


@pytest.fixture(scope="module")
def llm():
    return LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32")


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kwargs=KWARGS)
def test_item6_sampling_params_are_refused_or_run_without_failing_a_step(llm, kwargs):
    try:
        params = SamplingParams(**kwargs)
    except ValueError:
        return
    params.max_tokens = min(params.max_tokens or 4, 4)  # short cases: the values are the point
    params.min_tokens = min(params.min_tokens, params.max_tokens)
    try:
        outs = llm.generate(["The quick brown"], params, use_tqdm=False)
    except ValueError:
        assert not llm.engine.has_unfinished_requests()
        return
    assert outs[0].error is None, (kwargs, outs[0].error)
    assert llm.engine.num_used_blocks == 0
