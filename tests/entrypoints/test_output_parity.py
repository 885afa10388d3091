"""Output objects as a vLLM script reads them: RequestOutput's fields in vLLM's order (with
lora_request, encoder prompts, kv_transfer_params, add(), metrics' first_token_latency and
queued_ts),
LLM.encode's data a tensor, LLMEngine exported with vLLM's add_request, and two AsyncLLM
requests started at once with one id: one refused, none hung."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

import compiled_llm
from compiled_llm import LLM, CompletionOutput, LoRARequest, RequestOutput, SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.output.output_processor import OutputProcessor, request_output
from tests.entrypoints.pooling.checkpoints import decoder_classifier
from tests.utils import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def test_request_output_takes_vllms_positional_order():
    seq = CompletionOutput(0, "ab", [1, 2])
    out = RequestOutput("r", "p", [5], None, [seq], True)
    assert out.prompt_logprobs is None and out.outputs == [seq] and out.finished is True
    assert out.lora_request is None and out.encoder_prompt is None
    assert out.encoder_prompt_token_ids is None and out.kv_transfer_params is None
    assert seq.lora_request is None
    assert RequestOutput("r", "p", [5], None, [seq], True,
                         kv_transfer_params={"x": 1}).kv_transfer_params == {"x": 1}


def test_request_output_add_merges_as_vllms():
    out = RequestOutput("r", None, [5], None, [CompletionOutput(0, "a", [1])], False)
    out.add(RequestOutput("r", None, [5], None, [CompletionOutput(0, "b", [2]),
                                                  CompletionOutput(1, "c", [3])], True), True)
    assert [(o.index, o.text, o.token_ids) for o in out.outputs] == [(0, "ab", [1, 2]),
                                                                      (1, "c", [3])]
    assert out.finished
    out.add(RequestOutput("r", None, [5], None, [CompletionOutput(0, "z", [9])], True), False)
    assert (out.outputs[0].text, out.outputs[0].token_ids) == ("z", [9])


def test_outputs_name_the_lora_request():
    lora = LoRARequest("adapter", 1, "/nowhere")
    req = SimpleNamespace(request_id="r", parent_id="r", prompt=None, prompt_token_ids=[5],
                          sampling_params=GREEDY, lora_request=lora)
    state = OutputProcessor(None).start(req)
    state.finish("length")
    assert request_output("r", [state]).lora_request is lora


def test_generate_outputs_have_vllms_fields():
    with LLM(str(make_checkpoint("llama")), enforce_eager=True) as llm:
        out = llm.generate("The quick", GREEDY, use_tqdm=False)[0]
    assert out.lora_request is None and out.encoder_prompt is None
    assert out.kv_transfer_params is None and out.outputs[0].lora_request is None
    assert out.metrics.first_token_latency > 0 and out.metrics.arrival_time > 0
    # vLLM's queue time: scheduled_ts - queued_ts, both time.monotonic()
    assert 0 < out.metrics.queued_ts <= out.metrics.scheduled_ts <= out.metrics.first_token_ts


def test_llm_engine_add_request_takes_vllms_arguments():
    """arrival_time, lora_request, tokenization_kwargs, trace_headers, priority and
    prompt_text in vLLM's order; the metrics carry vLLM's arrival_time and
    first_token_latency; arguments it cannot honour are refused by name."""
    import time

    with LLM(str(make_checkpoint("llama")), enforce_eager=True) as llm:
        engine = llm.llm_engine
        arrival = time.time() - 5.0  # the request waited upstream before it was added
        engine.add_request("a", [5, 6, 7], GREEDY, arrival, None, None, None, 0, "abc")
        outs = []
        while engine.has_unfinished_requests():
            outs.extend(engine.step())
        [out] = [o for o in outs if o.finished]
        assert out.prompt == "abc" and out.prompt_token_ids == [5, 6, 7]
        assert out.metrics.arrival_time == arrival
        assert 5.0 <= out.metrics.first_token_latency < 60.0
        for name, value in (("tokenization_kwargs", {"x": "y"}), ("trace_headers", {"x": "y"}),
                            ("arrival_time", "yesterday"), ("arrival_time", True)):
            with pytest.raises(ValueError, match=name):
                engine.add_request("b", [5], GREEDY, **{name: value})
        assert not engine.has_unfinished_requests() and engine.num_used_blocks == 0


def test_encode_data_is_a_tensor():
    with LLM(str(decoder_classifier("qwen2")), enforce_eager=True) as llm:
        probs = llm.classify(["a text"], use_tqdm=False)[0].outputs.probs
        out = llm.encode(["a text"], use_tqdm=False)[0]
    assert isinstance(out.outputs.data, torch.Tensor) and out.outputs.data.shape == (3,)
    assert out.outputs.data.tolist() == probs and out.num_cached_tokens == 0


def test_llm_engine_is_exported():
    from compiled_llm.engine.llm_engine import LLMEngine

    assert "LLMEngine" in compiled_llm.__all__ and compiled_llm.LLMEngine is LLMEngine


@pytest.mark.parametrize("prompt", ["The quick brown", [5, 6, 7]])
def test_one_request_id_started_twice_at_once_is_refused_not_hung(prompt):
    engine = AsyncLLM(EngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True))

    async def run():
        return [o async for o in engine.generate(prompt, GREEDY, "dup")]

    async def main():
        return await asyncio.wait_for(asyncio.gather(run(), run(), return_exceptions=True), 60)

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], ValueError), results
    assert "already in use" in str(refused[0])
    done = next(r for r in results if not isinstance(r, BaseException))
    assert done[-1].finished and len(done[-1].outputs[0].token_ids) == 4
