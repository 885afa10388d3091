"""Cross-request batching of pooling calls: concurrent embed requests through AsyncPoolingLLM
share engine runs and each gets exactly its own embeddings (equal to one request at a time); a
bad request among them fails alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import minilm_dir

TEXTS = [f"request {i}: " + "the quick brown fox " * (1 + i % 5) for i in range(24)]


@pytest.fixture(scope="module")
def pooled():
    llm = AsyncPoolingLLM(EngineArgs(model=str(minilm_dir()), runner="pooling"))
    yield llm
    llm.shutdown()


async def _embed_all(llm, texts, params=None):
    calls = [llm.run("embed", text, params[i] if params else None) for i, text in enumerate(texts)]
    return await asyncio.gather(*calls, return_exceptions=True)


def test_concurrent_requests_share_runs_and_get_their_own_rows(pooled):
    alone = [pooled.engine.embed(*_prepared(pooled, text)) for text in TEXTS[:3]]
    runs = pooled.engine.joint_runs
    outs = asyncio.run(_embed_all(pooled, TEXTS))
    assert pooled.engine.joint_runs - runs < len(TEXTS) // 2  # requests met in the engine
    vectors = [o[0].outputs.embedding for o in outs]
    for i, vector in enumerate(vectors[:3]):
        np.testing.assert_allclose(vector, alone[i][0], atol=2e-5)
    assert [o[0].prompt_token_ids for o in outs] == [
        _prepared(pooled, text)[0][0][0] for text in TEXTS]


def test_a_bad_request_fails_alone(pooled):
    params = [None] * 8
    params[3] = PoolingParams(dimensions=8)  # MiniLM is not a Matryoshka model
    outs = asyncio.run(_embed_all(pooled, TEXTS[:8], params))
    assert isinstance(outs[3], ValueError) and "dimensions" in str(outs[3])
    assert all(len(o[0].outputs.embedding) == 384 for i, o in enumerate(outs) if i != 3)


def _prepared(llm, text):
    seqs = [llm.engine.tokenize(text)]
    return seqs, [PoolingParams()]
