"""Validation covers every value a request carries: each hostile value is a ValueError naming
its field, raised while a healthy request runs, which finishes as if nothing happened; every
value at the edge of what is accepted runs through model steps without an error."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.sampling_params import INT64_MAX, INT64_MIN
from tests.utils import make_checkpoint

HEALTHY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32",
               max_n_sequences=8, max_logprobs=5)


@pytest.fixture(scope="module")
def vocab(llm):
    return llm.engine.model_config.vocab_size


@pytest.fixture(scope="module")
def baseline(llm):
    return llm.generate("The quick brown", HEALTHY, use_tqdm=False)[0].outputs[0].token_ids


def run_all(engine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def refused_beside_a_healthy_request(llm, baseline, prompt, params, field: str) -> None:
    """The hostile request is refused, naming field, while a healthy one runs on unharmed."""
    engine = llm.engine
    engine.add_request("healthy", "The quick brown", HEALTHY)
    engine.step()  # the healthy request is running when the hostile one arrives
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        engine.add_request("hostile", prompt, params)
    done = run_all(engine)
    assert set(done) == {"healthy"} and done["healthy"].error is None
    assert done["healthy"].outputs[0].token_ids == baseline
    assert engine.num_used_blocks == 0


SEED_AND_TOP_K = [
    ("seed", lambda vocab: SamplingParams(seed=2 ** 64)),
    ("seed", lambda vocab: SamplingParams(seed=INT64_MIN - 1)),
    ("top_k", lambda vocab: SamplingParams(top_k=2 ** 63)),
    ("top_k", lambda vocab: SamplingParams(top_k=2 ** 31)),
]


@pytest.mark.parametrize("field,make", SEED_AND_TOP_K, ids=["seed_2_64", "seed_below_int64",
                                                            "top_k_2_63", "top_k_2_31"])
def test_row1_seed_and_top_k_out_of_range_are_refused(llm, baseline, vocab, field, make):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        make(vocab)


ENGINE_CHECKS = [
    ("stop_token_ids", lambda vocab: SamplingParams(stop_token_ids=[vocab], min_tokens=2)),
    ("stop_token_ids", lambda vocab: SamplingParams(stop_token_ids=[10 ** 6], min_tokens=1)),
    ("logit_bias", lambda vocab: SamplingParams(logit_bias={vocab + 3: 5.0})),
    ("allowed_token_ids", lambda vocab: SamplingParams(allowed_token_ids=[1, vocab])),
    ("n", lambda vocab: SamplingParams(n=9)),
    ("logprobs", lambda vocab: SamplingParams(logprobs=6)),
    ("prompt_logprobs", lambda vocab: SamplingParams(prompt_logprobs=6)),
    # each stop string is searched for at every token: 5,000 slowed every step 50-fold
    ("stop", lambda vocab: SamplingParams(stop=[f"s{i}" for i in range(65)])),
    ("stop", lambda vocab: SamplingParams(stop=["x" * 1025])),
]


@pytest.mark.parametrize("field,make", ENGINE_CHECKS,
                         ids=[f"{field}_{i}" for i, (field, _) in enumerate(ENGINE_CHECKS)])
def test_row1_ids_outside_the_vocabulary_and_limits_are_refused(llm, baseline, vocab, field,
                                                                make):
    refused_beside_a_healthy_request(llm, baseline, "hi", make(vocab), field)


@pytest.mark.parametrize("prompt", ["", [], {"prompt": ""}, {"prompt_token_ids": []}],
                         ids=["text", "ids", "dict_text", "dict_ids"])
def test_row12_an_empty_prompt_is_refused(llm, baseline, prompt):
    refused_beside_a_healthy_request(llm, baseline, prompt, SamplingParams(), "prompt")
    with pytest.raises(ValueError, match="^prompt must not be empty"):
        llm.generate([prompt], use_tqdm=False)


@pytest.mark.parametrize("prompt", [[True, 5], [1, 2.0], [1, "2"], [1, None]],
                         ids=["bool", "float", "str", "none"])
def test_row15_token_ids_are_exact_ints(llm, baseline, prompt):
    refused_beside_a_healthy_request(llm, baseline, prompt, SamplingParams(), "prompt")


def test_row8_a_lone_surrogate_is_refused(llm, baseline):
    refused_beside_a_healthy_request(llm, baseline, "a\ud800b", SamplingParams(), "prompt")
    with pytest.raises(ValueError, match="^stop must be valid UTF-8"):
        SamplingParams(stop=["x\udfff"])


def test_row7_an_oversized_text_prompt_is_refused_before_tokenizing(llm, baseline):
    big = "x" * (64 * llm.engine.max_model_len + 1)
    refused_beside_a_healthy_request(llm, baseline, big, SamplingParams(), "prompt")


def test_row1_values_at_the_edges_run_without_failing_a_step(llm, vocab):
    edges = [
        SamplingParams(seed=INT64_MAX, n=3, temperature=1.0, max_tokens=4),  # children wrap
        SamplingParams(seed=INT64_MIN, temperature=1.0, max_tokens=4),
        SamplingParams(top_k=2 ** 31 - 1, temperature=0.8, max_tokens=4),
        SamplingParams(stop_token_ids=[vocab - 1, 0], min_tokens=3, max_tokens=4),
        SamplingParams(logit_bias={vocab - 1: 100.0, 0: -100.0}, max_tokens=4),
        SamplingParams(allowed_token_ids=[vocab - 1, 7], temperature=1.0, max_tokens=4),
        SamplingParams(n=8, logprobs=5, prompt_logprobs=5, max_tokens=2),
    ]
    outs = llm.generate(["The quick brown"] * len(edges), edges, use_tqdm=False)
    assert all(out.error is None for out in outs), [out.error for out in outs]
    assert {t for o in outs[5].outputs for t in o.token_ids} <= {vocab - 1, 7}
    assert outs[4].outputs[0].token_ids == [vocab - 1] * 4
    assert llm.engine.num_used_blocks == 0


def test_row15_chat_content_none_counts_as_empty(llm):
    empty = llm.chat([{"role": "user", "content": ""}], HEALTHY, use_tqdm=False)[0]
    none = llm.chat([{"role": "user", "content": None}], HEALTHY, use_tqdm=False)[0]
    assert none.error is None and none.prompt_token_ids == empty.prompt_token_ids
    assert none.outputs[0].token_ids == empty.outputs[0].token_ids


def test_row15_chat_text_parts_are_joined_by_newlines(llm):
    # as vLLM's "string" content format (the server's chat endpoint does the same)
    def prompt(content) -> list[int]:
        out = llm.chat([{"role": "user", "content": content}], HEALTHY, use_tqdm=False)[0]
        return out.prompt_token_ids

    parts = [{"type": "text", "text": "The quick"}, {"type": "text", "text": "brown fox"}]
    assert prompt(parts) == prompt("The quick\nbrown fox") != prompt("The quickbrown fox")


@pytest.mark.parametrize("messages,field", [
    ([{"role": "user", "content": 5}], r"messages\[0\]\.content"),
    ([{"role": "user", "content": [{"type": "image", "url": "x"}]}], r"messages\[0\]\.content"),
    ([{"role": "user", "content": "ok"}, {"content": "no role"}], r"messages\[1\]\.role"),
    ([{"role": "user", "content": "a\udfffb"}], r"messages\[0\]\.content"),
    ([[]], "messages"),
], ids=["int", "image_part", "no_role", "surrogate", "empty"])
def test_row15_malformed_chat_messages_are_refused(llm, messages, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        llm.chat(messages, HEALTHY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
