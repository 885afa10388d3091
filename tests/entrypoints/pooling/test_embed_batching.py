"""The pooling engine's batched paths: texts tokenized in one tokenizer call equal one call per
text, many prompts over several forwards come back in prompt order and equal one prompt at a
time (and sentence-transformers), per-prompt settings mixed in one forward, the pooling token
budget's default, bad input among many still a ValueError with nothing held after it, and the
reference backend's padded bidirectional attention equal to one SDPA call per sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiled_llm import LLM
from compiled_llm.engine.pooling_engine import POOLING_MAX_NUM_BATCHED_TOKENS
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import bert_classifier, minilm_dir

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "embeddings",
         "land", "close", "together"]
TEXTS = [" ".join(WORDS[i % 7:i % 7 + 2 + i % 11]) + f" #{i}" for i in range(40)]


@pytest.fixture(scope="module")
def small_steps():
    """MiniLM with a 96-token budget per forward: 40 texts take several forwards."""
    llm = LLM(str(minilm_dir()), enforce_eager=True, max_num_batched_tokens=96, max_num_seqs=8)
    yield llm
    llm.shutdown()


def _vectors(outputs) -> torch.Tensor:
    return torch.tensor([o.outputs.embedding for o in outputs])


def test_tokenize_many_equals_one_call_per_prompt(small_steps):
    engine = small_steps.engine
    prompts = [TEXTS[0], [101, 2000, 102], {"prompt": TEXTS[1]}, {"prompt_token_ids": [101, 7]},
               TEXTS[2], "Ünïcödé 日本語 🚀"]
    truncates = [None, None, 3, None, -1, None]
    assert engine.tokenize_many(prompts, truncates) == [
        engine.tokenize(p, t) for p, t in zip(prompts, truncates)]
    ids, types = engine.tokenize(TEXTS[0])
    assert types is None and ids[0] == 101 and ids[-1] == 102  # all-zero types are dropped


def test_many_texts_in_order_equal_one_at_a_time(small_steps):
    from sentence_transformers import SentenceTransformer

    engine = small_steps.engine
    assert len(list(engine.batches(engine.tokenize_many(TEXTS, [None] * len(TEXTS))))) > 4
    outs = small_steps.embed(TEXTS)
    batched = _vectors(outs)
    alone = torch.cat([_vectors(small_steps.embed(t)) for t in TEXTS[:6]])
    torch.testing.assert_close(batched[:6], alone, atol=1e-5, rtol=1e-5)
    assert [o.prompt_token_ids for o in outs] == [
        small_steps.engine.tokenize(t)[0] for t in TEXTS]
    ref = SentenceTransformer(str(minilm_dir()), device="cpu").encode(
        TEXTS, convert_to_tensor=True).float()
    assert (F.cosine_similarity(batched, ref) >= 0.999).all()
    assert small_steps.engine.num_used_blocks == 0 and small_steps.engine.runner.kv_caches == []


def test_mixed_settings_in_one_forward(small_steps):
    params = [PoolingParams(normalize=i % 2 == 0) for i in range(6)]
    mixed = _vectors(small_steps.embed(TEXTS[:6], params))
    norm = _vectors(small_steps.embed(TEXTS[:6]))
    raw = _vectors(small_steps.embed(TEXTS[:6], PoolingParams(normalize=False)))
    torch.testing.assert_close(mixed[0::2], norm[0::2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1::2], raw[1::2], atol=1e-5, rtol=1e-5)


def test_bad_input_among_many_is_a_value_error(small_steps):
    for bad, field in (("word " * 300, "max_model_len"), ({"prompt": 3}, "prompt"),
                       ("bad \udc80 surrogate", "prompt")):
        with pytest.raises(ValueError, match=field):
            small_steps.embed([*TEXTS[:5], bad, *TEXTS[5:9]])
    assert small_steps.engine.num_used_blocks == 0
    assert len(small_steps.embed(TEXTS[:3])) == 3  # still serving


def test_pooling_token_budget_default():
    llm = LLM(str(minilm_dir()), enforce_eager=True)
    assert llm.engine.max_num_batched_tokens == POOLING_MAX_NUM_BATCHED_TOKENS
    llm.shutdown()


def test_classify_mixed_activation_in_one_forward():
    llm = LLM(str(bert_classifier(3)), enforce_eager=True, dtype="float32")
    params = [PoolingParams(use_activation=i % 2 == 0) for i in range(4)]
    mixed = [o.outputs.probs for o in llm.classify(TEXTS[:4], params)]
    probs = [o.outputs.probs for o in llm.classify(TEXTS[:4])]
    logits = [o.outputs.probs for o in llm.classify(TEXTS[:4], PoolingParams(use_activation=False))]
    for i, row in enumerate(mixed):
        torch.testing.assert_close(torch.tensor(row), torch.tensor((probs if i % 2 == 0 else
                                                                    logits)[i]), atol=1e-5, rtol=0)
    llm.shutdown()


def test_padded_bidirectional_attention_equals_one_call_per_sequence():
    from compiled_llm.attention.reference import length_groups, padded_attention

    lens = [1, 5, 7, 40, 3, 120, 9, 64]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(starts[-1], 4, 16, generator=gen)
    k, v = (torch.randn(starts[-1], 2, 16, generator=gen) for _ in range(2))  # GQA: 2 K/V heads
    assert len(length_groups(lens)) > 2  # several padded calls
    out = torch.zeros_like(q)
    padded_attention(q, k, v, starts, 0.25, out)
    for start, end in zip(starts, starts[1:]):
        ref = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1), k[start:end].transpose(0, 1),
            v[start:end].transpose(0, 1), scale=0.25, enable_gqa=True).transpose(0, 1)
        torch.testing.assert_close(out[start:end], ref, atol=1e-5, rtol=1e-5)
