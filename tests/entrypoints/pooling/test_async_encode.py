"""vLLM's AsyncLLM.encode: AsyncLLM(...) on a pooling model builds the pooling engine, whose encode
yields one finished PoolingRequestOutput per request (the same rows as LLM's pooling calls, under
the caller's request id), refuses what it cannot honour by name, and refuses generate."""

from __future__ import annotations

import asyncio

import pytest
import torch

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM
from compiled_llm.output.pooling_outputs import PoolingRequestOutput
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import bert_classifier


@pytest.fixture(scope="module")
def pooled():
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(bert_classifier(3)), dtype="float32",
                                               enforce_eager=True))
    yield llm
    llm.shutdown()


async def _encode(llm, prompt, params, rid, **kw):
    return [out async for out in llm.encode(prompt, params, rid, **kw)]


def test_encode_yields_the_finished_output(pooled):
    assert isinstance(pooled, AsyncPoolingLLM)

    async def main():
        both = await asyncio.gather(_encode(pooled, "a short one", PoolingParams(), "a"),
                                    _encode(pooled, "another", PoolingParams(task="classify"),
                                            "b", truncate_prompt_tokens=2))
        ref = await pooled.run("classify", ["a short one", "another"],
                               [PoolingParams(), PoolingParams(truncate_prompt_tokens=2)])
        return both, ref

    (first, second), ref = asyncio.run(main())
    assert len(first) == len(second) == 1
    for out, want, rid in zip((first[0], second[0]), ref, "ab", strict=True):
        assert isinstance(out, PoolingRequestOutput) and out.finished
        assert out.request_id == rid and out.prompt_token_ids == want.prompt_token_ids
        torch.testing.assert_close(out.outputs.data, torch.tensor(want.outputs.probs))
    assert len(second[0].prompt_token_ids) == 2


@pytest.mark.parametrize("kwargs, name", [
    ({"lora_request": object()}, "lora_request"),
    ({"trace_headers": {"traceparent": "x"}}, "trace_headers"),
    ({"priority": 1}, "priority"),
    ({"tokenization_kwargs": {"add_special_tokens": False}}, "tokenization_kwargs"),
    ({"reasoning_ended": True}, "reasoning_ended"),
])
def test_encode_refuses_by_name(pooled, kwargs, name):
    with pytest.raises(ValueError, match=name):
        asyncio.run(_encode(pooled, "text", PoolingParams(), "r", **kwargs))


def test_encode_refuses_bad_input_and_generate(pooled):
    with pytest.raises(ValueError, match="pooling_params"):
        asyncio.run(_encode(pooled, "text", {"task": "embed"}, "r"))
    with pytest.raises(ValueError, match="one prompt"):
        asyncio.run(_encode(pooled, ["two", "prompts"], None, "r"))
    with pytest.raises(ValueError, match="runner='generate'"):
        asyncio.run(pooled.generate("a prompt", None, "g").__anext__())
    with pytest.raises(ValueError, match="core_endpoint"):
        AsyncLLM(EngineArgs(model=str(bert_classifier(3))), core_endpoint=object())
