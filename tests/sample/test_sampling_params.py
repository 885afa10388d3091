"""SamplingParams: vLLM-compatible defaults, normalisation and field-named validation errors."""

import pytest
import torch

from compiled_llm.sampling_params import SamplingParams, SamplingType, StructuredOutputsParams

BAD_VALUES = [
    ("n", 0),
    ("n", -3),
    ("n", 1.5),
    ("n", True),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", "0.1"),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", float("nan")),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", float("inf")),
    ("temperature", -1.0),
    ("temperature", -1e-9),
    ("temperature", float("inf")),
    ("temperature", float("nan")),
    ("temperature", None),
    ("temperature", 2.01),  # vLLM's (OpenAI's) range is [0, 2]
    ("temperature", 100.0),
    ("top_p", 0),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", -0.5),
    ("top_k", -2),
    ("top_k", 2.0),
    ("top_k", None),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("seed", 1.5),
    ("seed", "42"),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", [3]),
    ("stop", 7),
    ("stop_token_ids", [1, -1]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", 5),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("min_tokens", 1.0),
    ("logprobs", -2),
    ("logprobs", 1.5),
    ("prompt_logprobs", -2),
    ("ignore_eos", 1),
    ("detokenize", "yes"),
    ("skip_special_tokens", None),
    ("spaces_between_special_tokens", 0),
    ("include_stop_str_in_output", 1),
    ("logits_processors", [1]),
    ("logits_processors", lambda ids, row: row),
    # row 1: what the sampler's int64/int32 tensors and torch generators cannot hold
    ("seed", 2 ** 64),
    ("seed", 2 ** 63),
    ("seed", -(2 ** 63) - 1),
    ("seed", True),
    ("top_k", 2 ** 63),
    ("top_k", 2 ** 31),
    ("stop_token_ids", [2 ** 64]),
    ("stop_token_ids", [True]),
    # row 8: a lone surrogate has no UTF-8 encoding
    ("stop", ["ok\ud800"]),
    ("logit_bias", {1: float("inf")}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"1": 1.0}),
    ("logit_bias", {True: 1.0}),
    ("logit_bias", [1]),
    ("allowed_token_ids", []),
    ("allowed_token_ids", [1, -2]),
    ("allowed_token_ids", [False]),
]


@pytest.mark.parametrize("name,value", BAD_VALUES)
def test_bad_value_names_field(name, value):
    # Anchored: the message must start with the field name, not merely contain it.
    with pytest.raises(ValueError, match=rf"^{name} "):
        SamplingParams(**{name: value})


def test_error_messages_are_readable():
    with pytest.raises(ValueError, match=r"^temperature must be non-negative, got -1.0$"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\], got 0$"):
        SamplingParams(top_p=0)


def test_min_tokens_bounded_by_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    assert SamplingParams(min_tokens=4, max_tokens=4).min_tokens == 4
    assert SamplingParams(min_tokens=100, max_tokens=None).max_tokens is None


BAD_STRUCTURED = [
    ("choice", {"choice": "abc"}),  # row 14: a string is not split into choices a, b, c
    ("any_whitespace", {"json_object": True, "any_whitespace": "yes"}),  # row 10
    ("any_whitespace", {"regex": "a", "any_whitespace": 1}),
    ("json_object", {"json_object": 1}),
    ("regex", {"regex": "a\udc00"}),  # row 8
    ("grammar", {"grammar": 'root ::= "\ud800"'}),
    ("choice", {"choice": ["ok", "\ud800"]}),
    ("json", {"json": {"type": "string", "enum": ["\ud800"]}}),
    ("json", {"json": {"type": "object", "x": {1, 2}}}),  # not JSON at all
]


@pytest.mark.parametrize("field,spec", BAD_STRUCTURED,
                         ids=[f"{field}_{i}" for i, (field, _) in enumerate(BAD_STRUCTURED)])
def test_row10_row14_structured_outputs_values_are_checked(field, spec):
    with pytest.raises(ValueError, match=rf"^structured_outputs.{field} "):
        StructuredOutputsParams.from_dict(spec)
    with pytest.raises(ValueError, match=rf"^structured_outputs.{field} "):
        SamplingParams(structured_outputs=spec)


def test_logit_bias_and_allowed_ids_are_normalised():
    p = SamplingParams(logit_bias={3: 1, 4: -2.5}, allowed_token_ids=(5, 6))
    assert p.logit_bias == {3: 1.0, 4: -2.5} and isinstance(p.logit_bias[3], float)
    assert p.allowed_token_ids == [5, 6]
    q = p.clone()
    q.logit_bias[9] = 1.0
    q.allowed_token_ids.append(7)
    assert 9 not in p.logit_bias and p.allowed_token_ids == [5, 6]


def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop="x", detokenize=False)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.seed is None
    assert p.stop == [] and p.stop_token_ids == []
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.skip_special_tokens and p.spaces_between_special_tokens and p.detokenize
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.logits_processors is None and p.structured_outputs is None


def test_normalisation():
    p = SamplingParams(top_k=-1, stop="END", stop_token_ids=(3, 4), temperature=1)
    assert p.top_k == 0 and p.stop == ["END"] and p.stop_token_ids == [3, 4]
    assert isinstance(p.temperature, float)
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]
    assert SamplingParams(top_k=5).top_k == 5


def test_sampling_type_and_greedy_reset():
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, seed=1)
    assert greedy.is_greedy and greedy.sampling_type == SamplingType.GREEDY
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)
    tiny = SamplingParams(temperature=5e-6)  # vLLM raises it to 0.01: it samples
    assert tiny.temperature == 0.01 and not tiny.is_greedy
    assert SamplingParams(temperature=0.7).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert not SamplingParams(temperature=0.7).is_greedy


def test_output_text_buffer_length():
    assert SamplingParams().output_text_buffer_length == 0
    assert SamplingParams(stop=["ab", "xyz"]).output_text_buffer_length == 2
    p = SamplingParams(stop=["ab", "xyz"], include_stop_str_in_output=True)
    assert p.output_text_buffer_length == 0


def test_clone_is_independent_but_shares_processors():
    def proc(ids: list[int], row: torch.Tensor) -> torch.Tensor:
        return row

    grammar = StructuredOutputsParams(regex="[ab]+")
    p = SamplingParams(stop=["a"], stop_token_ids=[1], logits_processors=[proc], seed=7)
    p.structured_outputs = grammar
    q = p.clone()
    assert q == p and q is not p
    q.stop.append("b")
    q.stop_token_ids.append(2)
    q.logits_processors.append(proc)
    assert p.stop == ["a"] and p.stop_token_ids == [1] and len(p.logits_processors) == 1
    assert q.logits_processors[0] is proc and q.structured_outputs is grammar


def test_structured_outputs_keys_that_are_no_fields_are_refused():
    # found by the hypothesis run: an int key among str ones made sorting the keys raise
    with pytest.raises(ValueError, match=r"^structured_outputs: unknown fields \['', 0\]"):
        SamplingParams(structured_outputs={0: None, "": None})
    with pytest.raises(ValueError, match="^structured_outputs must be a dict"):
        StructuredOutputsParams.from_dict([("regex", "a")])


def test_from_optional_takes_none_for_defaults_and_openai_logit_bias():
    p = SamplingParams.from_optional(n=None, temperature=None, top_p=None, presence_penalty=None,
                                     frequency_penalty=None, repetition_penalty=None,
                                     max_tokens=5, logit_bias={"7": 250, 3: -0.5})
    assert p == SamplingParams(max_tokens=5, logit_bias={7: 100.0, 3: -0.5})
    assert SamplingParams.from_optional(temperature=0.0).is_greedy
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_optional(logit_bias={"x": 1.0})
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_optional(top_p=2.0)


def test_update_from_generation_config_adds_its_other_eos_ids():
    p = SamplingParams(stop_token_ids=[9])
    p.update_from_generation_config({"eos_token_id": [2, 5, 9]}, eos_token_id=2)
    assert p.stop_token_ids == [9, 5]
    q = SamplingParams()
    q.update_from_generation_config({"eos_token_id": 4})
    assert q.stop_token_ids == [4]
    ignored = SamplingParams(ignore_eos=True)
    ignored.update_from_generation_config({"eos_token_id": [4]})
    assert ignored.stop_token_ids == []
    assert SamplingParams(stop_token_ids=[3, 3, 4, 3]).stop_token_ids == [3, 4]  # vLLM's dedup
