"""RoBERTa and XLM-RoBERTa encoders (embeddings, classifiers, cross-encoder scores) against
transformers on tiny random checkpoints: positions offset by the padding id, the "roberta."
weights, RobertaClassificationHead, and max_model_len short of the position table by that offset."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import (
    assert_classify_matches,
    assert_compiled_matches_eager,
    assert_scores_match,
    hf_encoder,
)
from tests.utils import tokenizer_dir

TEXTS = ["a short one", "A somewhat longer sentence, with punctuation!", "ok"]
PAD = 2  # not RoBERTa's usual 1, so a wrong offset shows


@functools.cache
def roberta(kind: str, num_labels: int = 0) -> Path:
    """A tiny random (XLM-)RoBERTa: its base model, or a classifier of num_labels."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    config_cls = {"roberta": transformers.RobertaConfig,
                  "xlm": transformers.XLMRobertaConfig}[kind]
    cfg = config_cls(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=80,
                     type_vocab_size=1, pad_token_id=PAD, initializer_range=0.2,
                     num_labels=max(num_labels, 1))
    torch.manual_seed(len(kind) + num_labels)
    auto = (transformers.AutoModelForSequenceClassification if num_labels
            else transformers.AutoModel)
    model = auto.from_config(cfg)
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{kind}{num_labels}-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["roberta", "xlm"])
def test_embeddings_match_transformers(kind):
    ckpt = roberta(kind)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    assert llm.runner_type == "pooling"
    assert llm.engine.max_model_len == 80 - PAD - 1  # the positions past the padding id
    outs = llm.embed(TEXTS, PoolingParams(normalize=False))
    hf, tok = hf_encoder(ckpt, classifier=False)
    for text, out in zip(TEXTS, outs):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).last_hidden_state[0, 0]  # CLS pooling
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.embed("word " * 100)
    llm.shutdown()


@pytest.mark.parametrize("kind", ["roberta", "xlm"])
def test_classifier_matches_transformers(kind):
    ckpt = roberta(kind, num_labels=3)
    with LLM(str(ckpt), enforce_eager=True, dtype="float32") as llm:
        assert_classify_matches(llm, ckpt, TEXTS)


def test_reranker_scores_match_transformers():
    ckpt = roberta("xlm", num_labels=1)  # bge-reranker's shape: one label, sigmoid
    with LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32") as llm:
        assert_scores_match(llm, ckpt)


def test_compiled_classifier_matches_eager():
    assert_compiled_matches_eager(  # split at its 2 attentions
        roberta("roberta", num_labels=3),
        lambda llm: [o.outputs.probs for o in llm.classify(TEXTS)], 2 + 1)
