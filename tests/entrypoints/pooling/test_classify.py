"""llm.classify against transformers' *ForSequenceClassification (tiny random BERT, Qwen2,
Qwen3, Llama and Mistral classifiers) and llm.score as a cross-encoder (one label: sigmoid of
the pair's logit, token types included) against the same."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import bert_classifier, decoder_classifier
from tests.utils import random_prompts

TEXTS = ["a short one", "A somewhat longer sentence to classify, with punctuation!", "ok"]


def _hf(ckpt):
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(ckpt).eval()


def test_bert_classify_matches_transformers():
    import transformers

    ckpt = bert_classifier(3)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")  # auto: a classifier pools
    outs = llm.classify(TEXTS)
    tok, hf = transformers.AutoTokenizer.from_pretrained(ckpt), _hf(ckpt)
    for text, out in zip(TEXTS, outs):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).logits[0].softmax(-1)
        torch.testing.assert_close(torch.tensor(out.outputs.probs), ref, atol=1e-5, rtol=1e-5)
    assert outs[0].outputs.num_classes == 3
    raw = llm.classify(TEXTS[0], PoolingParams(use_activation=False))[0].outputs.probs
    assert abs(sum(raw) - 1) > 1e-3  # logits, not probabilities
    with pytest.raises(ValueError, match="runner"):
        llm.embed("a classifier does not embed")
    with pytest.raises(ValueError, match="score"):
        llm.score("three labels", "are not a cross-encoder")
    llm.shutdown()


def test_bert_cross_encoder_score_matches_transformers():
    import transformers

    ckpt = bert_classifier(1)
    llm = LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32")
    query, docs = "what is a fox", ["The quick brown fox.", "Tax law of 1998.", "foxes are canids"]
    scores = [o.outputs.score for o in llm.score(query, docs)]
    tok, hf = transformers.AutoTokenizer.from_pretrained(ckpt), _hf(ckpt)
    for doc, score in zip(docs, scores):
        enc = tok(query, doc, return_tensors="pt")  # token types 0 | 1
        assert enc["token_type_ids"].any()
        with torch.no_grad():
            ref = hf(**enc).logits[0, 0].sigmoid().item()
        assert score == pytest.approx(ref, abs=1e-5)
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3", "mistral"])
def test_decoder_classify_matches_transformers(kind):
    ckpt = decoder_classifier(kind)
    prompts = random_prompts(3, 300, lo=2, hi=25, seed=9)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    assert llm.runner_type == "pooling"
    outs = llm.classify([{"prompt_token_ids": p} for p in prompts])
    hf = _hf(ckpt)
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].softmax(-1)
        torch.testing.assert_close(torch.tensor(out.outputs.probs), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="runner"):
        llm.generate({"prompt_token_ids": prompts[0]})
    llm.shutdown()
