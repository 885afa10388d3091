"""Sampling semantics as vLLM defines them, through LLM.generate: no stop string ends a request
within min_tokens, nor an EOS (ignore_eos too); the model's other EOS ids stop with their id as
stop_reason, and so do all of them without a tokenizer; detokenize=False leaves logprobs'
decoded tokens unset; DELTA outputs carry the prompt logprobs once a sequence."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.output.outputs import merge_deltas
from compiled_llm.sampling_params import RequestOutputKind
from tests.utils import make_checkpoint

PROMPT = "The quick brown fox jumps over the lazy dog. The quick"


@pytest.fixture(scope="module")
def ckpt() -> Path:
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def llm(ckpt):
    engine = LLM(model=str(ckpt), enforce_eager=True, dtype="float32")
    yield engine
    engine.shutdown()


def _greedy(llm: LLM, **kw):
    params = SamplingParams(temperature=0.0, **{"max_tokens": 12, "ignore_eos": True, **kw})
    return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]


def _early_stop_string(llm: LLM) -> tuple[str, int]:
    """A character the greedy output shows within its first three tokens, and that token."""
    for count in (1, 2, 3):
        text = _greedy(llm, max_tokens=count).text
        if text.strip():
            return text.strip()[-1], count
    pytest.skip("the greedy output starts with three blank tokens")


def test_no_stop_string_within_min_tokens(llm):
    stop, count = _early_stop_string(llm)
    early = _greedy(llm, stop=[stop])
    assert early.finish_reason == "stop" and len(early.token_ids) <= count
    late = _greedy(llm, stop=[stop], min_tokens=count + 2)
    assert len(late.token_ids) >= count + 2
    assert late.text.startswith(early.text)
    assert llm.engine.num_used_blocks == 0


def test_min_tokens_bans_eos_with_ignore_eos_too(llm):
    # vLLM's min_tokens bans all_stop_token_ids, which hold the EOS ids whatever ignore_eos
    eos = llm.get_tokenizer().eos_token_id
    out = _greedy(llm, max_tokens=4, min_tokens=2, logit_bias={eos: 100.0})
    assert eos not in out.token_ids[:2] and out.token_ids[2:] == [eos, eos]
    assert out.finish_reason == "length"


def test_other_eos_ids_report_their_id(ckpt, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(ckpt, model)
    with LLM(model=str(model), enforce_eager=True, dtype="float32") as plain:
        second = _greedy(plain).token_ids[1]
        primary = plain.get_tokenizer().eos_token_id
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [second, primary]}))
    with LLM(model=str(model), enforce_eager=True, dtype="float32") as llm:
        out = _greedy(llm, ignore_eos=False)
        assert (out.finish_reason, out.stop_reason) == ("stop", second)
        assert len(out.token_ids) <= 2
        assert len(_greedy(llm).token_ids) == 12  # ignore_eos ignores every EOS id


def test_without_a_tokenizer_every_eos_id_reports_its_id(ckpt, tmp_path):
    # vLLM: with no tokenizer EOS, the config's EOS ids are all stop tokens (stop_reason: id)
    model = tmp_path / "model"
    shutil.copytree(ckpt, model)
    with LLM(model=str(model), enforce_eager=True, dtype="float32") as plain:
        first = _greedy(plain).token_ids[1]
        ids = plain.get_tokenizer().encode(PROMPT)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [first, 3]}))
    with LLM(model=str(model), enforce_eager=True, dtype="float32",
             skip_tokenizer_init=True) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
        assert (out.finish_reason, out.stop_reason) == ("stop", first)


def test_no_decoded_tokens_without_detokenize(llm):
    out = _greedy(llm, max_tokens=3, detokenize=False, logprobs=2)
    assert out.text == "" and len(out.logprobs) == 3
    assert all(lp.decoded_token is None for step in out.logprobs for lp in step.values())
    shown = _greedy(llm, max_tokens=3, logprobs=2)
    assert all(lp.decoded_token is not None for step in shown.logprobs for lp in step.values())


def test_vllm_spellings_of_params():
    assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed"
    assert SamplingParams(logprobs=True, prompt_logprobs=True).logprobs == 1
    assert SamplingParams(logprobs=-1).logprobs == -1
    with pytest.raises(ValueError, match="n must be 1 when using greedy sampling"):
        SamplingParams(n=3, temperature=0.0)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=-2)


def test_seed_minus_one_draws_afresh(llm):
    params = SamplingParams(temperature=1.0, seed=-1, max_tokens=8, ignore_eos=True)
    draws = {tuple(out.outputs[0].token_ids)
             for out in llm.generate([PROMPT] * 3, params, use_tqdm=False)}
    assert len(draws) > 1


def test_whole_vocab_logprobs_need_max_logprobs(ckpt, llm):
    params = SamplingParams(temperature=0.0, max_tokens=2, logprobs=-1)
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.generate([PROMPT], params, use_tqdm=False)
    assert llm.engine.num_used_blocks == 0
    with LLM(model=str(ckpt), enforce_eager=True, dtype="float32", max_logprobs=-1) as wide:
        out = wide.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
        vocab = wide.get_tokenizer().vocab_size
        assert all(len(step) >= vocab - 1 for step in out.logprobs)
        with pytest.raises(ValueError, match=r"logprobs must be <= [1-9]\d* \(max_logprobs"):
            wide.generate([PROMPT], SamplingParams(max_tokens=2, logprobs=10**6),
                          use_tqdm=False)  # the limit is the vocabulary's size, not -1


def test_tiny_temperatures_are_raised_to_vllms_floor():
    assert SamplingParams(temperature=1e-4).temperature == 1e-2
    assert SamplingParams(temperature=0.0).temperature == 0.0


def _engine_outputs(llm: LLM, request_id: str, params: SamplingParams) -> list:
    engine = llm.llm_engine
    engine.add_request(request_id, PROMPT, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(out for out in engine.step() if out.request_id == request_id)
    return outs


def _plp_keys(rows) -> list:
    return [None if row is None else sorted(row) for row in rows]


def test_delta_outputs_carry_the_prompt_logprobs_once(llm):
    # vLLM: the first delta of a sequence brings the prompt logprobs, later ones an empty list
    kw = dict(temperature=1.0, seed=0, n=2, max_tokens=5, ignore_eos=True, prompt_logprobs=1)
    final = _engine_outputs(llm, "final", SamplingParams(
        output_kind=RequestOutputKind.FINAL_ONLY, **kw))[-1]
    deltas = _engine_outputs(llm, "delta", SamplingParams(
        output_kind=RequestOutputKind.DELTA, **kw))
    assert len(deltas) > 1 and len(final.prompt_logprobs) == len(final.prompt_token_ids)
    # one output per sequence that moved (vLLM's shape): each sequence's first brings them
    seen = set()
    for out in deltas:
        (seq,) = out.outputs
        if seq.index in seen:
            assert out.prompt_logprobs == []
        else:
            assert _plp_keys(out.prompt_logprobs) == _plp_keys(final.prompt_logprobs)
        seen.add(seq.index)
    assert seen == {0, 1}
    merged = functools.reduce(merge_deltas, deltas)  # a consumer's merged view keeps them
    assert _plp_keys(merged.prompt_logprobs) == _plp_keys(final.prompt_logprobs)
    assert [o.token_ids for o in merged.outputs] == [o.token_ids for o in final.outputs]
    plain = _engine_outputs(llm, "plain", SamplingParams(
        output_kind=RequestOutputKind.DELTA, **{**kw, "prompt_logprobs": None}))
    assert all(out.prompt_logprobs is None for out in plain)
