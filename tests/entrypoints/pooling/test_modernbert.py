"""ModernBERT encoders (ModernBertModel embeddings, ModernBertForSequenceClassification with cls
and mean pooling, a one-label reranker's scores) against transformers on tiny random checkpoints
whose local layers' window is shorter than the prompts, eager and compiled."""

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
    assert_scores_match,
    hf_encoder,
)
from tests.utils import tokenizer_dir

TEXTS = ["a short one", "A somewhat longer sentence, with punctuation! And a second clause.",
         "ok"]


@functools.cache
def modernbert(num_labels: int = 0, pooling: str = "cls") -> Path:
    """A tiny random ModernBERT: the bare encoder, or a classifier of num_labels."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = transformers.ModernBertConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, local_attention=8, max_position_embeddings=256,
        classifier_pooling=pooling, num_labels=max(num_labels, 1), initializer_range=0.2,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, cls_token_id=None,
        sep_token_id=None)
    torch.manual_seed(num_labels + len(pooling))
    auto = (transformers.AutoModelForSequenceClassification if num_labels
            else transformers.AutoModel)
    model = auto.from_config(cfg, attn_implementation="sdpa")
    out = Path(tempfile.mkdtemp(prefix=f"cllm-modernbert{num_labels}{pooling}-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("enforce_eager", [True, False])
def test_embeddings_match_transformers(enforce_eager):
    ckpt = modernbert()
    llm = LLM(str(ckpt), enforce_eager=enforce_eager, dtype="float32")
    assert llm.runner_type == "pooling"
    outs = llm.embed(TEXTS, PoolingParams(normalize=False))
    hf, tok = hf_encoder(ckpt, classifier=False)
    for text, out in zip(TEXTS, outs):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).last_hidden_state[0, 0]  # CLS pooling
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-4,
                                   rtol=1e-4)
    llm.shutdown()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_matches_transformers(pooling):
    ckpt = modernbert(num_labels=3, pooling=pooling)
    with LLM(str(ckpt), enforce_eager=True, dtype="float32") as llm:
        assert_classify_matches(llm, ckpt, TEXTS)


def test_reranker_scores_match_transformers():
    ckpt = modernbert(num_labels=1)
    with LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32") as llm:
        assert_scores_match(llm, ckpt)


def test_older_config_spelling_reads_the_same(tmp_path):
    # transformers 4.x's config.json: global/local_rope_theta and global_attn_every_n_layers
    import json
    import shutil

    ckpt = modernbert()
    old = tmp_path / "old"
    shutil.copytree(ckpt, old)
    config = json.loads((old / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        config.pop(key)
    config.update(global_rope_theta=160000.0, local_rope_theta=10000.0,
                  global_attn_every_n_layers=3)
    (old / "config.json").write_text(json.dumps(config))
    vectors = []
    for path in (ckpt, old):
        with LLM(str(path), enforce_eager=True, dtype="float32") as llm:
            vectors.append(torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)]))
    torch.testing.assert_close(vectors[0], vectors[1], atol=0, rtol=0)
