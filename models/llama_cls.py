"""Decoders for pooling: with a classification head (HF's *ForSequenceClassification: the last
token's hidden state through `score`, a bias-free linear) and bare (HF's LlamaModel /
MistralModel / Qwen2Model / Qwen3Model / Gemma3TextModel: embedding checkpoints). Pooling
runs only: no lm_head; attention is causal but for Gemma 3's use_bidirectional_attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.gemma3 import Gemma3EmbeddingConfig, Gemma3ForCausalLM
from compiled_llm.models.llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
from compiled_llm.models.qwen3 import Qwen3ForCausalLM

SCORE_METHODS = ("from_2_way_softmax", "no_post_processing")


@dataclass
class ClassifierConfig(DecoderConfig):
    """DecoderConfig plus the classifier's labels; classifier_from_token (vLLM's, set through
    hf_overrides on a causal LM's checkpoint: Qwen3-Reranker) names the vocabulary rows the
    score head is made of, score_method how."""

    num_labels: int = 2
    id2label: dict | None = None
    classifier_from_token: tuple[str, ...] = ()
    score_method: str = ""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> ClassifierConfig:
        """DecoderConfig's fields, then num_labels (from id2label when not given, else from
        classifier_from_token: one label for a 2-way softmax, else one per token)."""
        cfg = super().from_hf(hf_config, **defaults)
        id2label = {str(k): v for k, v in (hf_config.get("id2label") or {}).items()}
        cfg.num_labels = hf_config.get("num_labels") or len(id2label) or 2
        cfg.id2label = id2label
        tokens = tuple(hf_config.get("classifier_from_token") or ())
        if tokens:
            two_way = hf_config.get("is_original_qwen3_reranker") and "from_2_way_softmax"
            cfg.score_method = hf_config.get("method") or two_way or "no_post_processing"
            _check_score_method(cfg.score_method, tokens)
            two_way = cfg.score_method == "from_2_way_softmax"
            cfg.classifier_from_token, cfg.num_labels = tokens, 1 if two_way else len(tokens)
        return cfg


def _check_score_method(method: str, tokens: tuple[str, ...]) -> None:
    if method not in SCORE_METHODS:
        raise ValueError(f"method {method!r} is not supported; have {list(SCORE_METHODS)}")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"classifier_from_token must name 2 tokens for from_2_way_softmax, "
                         f"got {list(tokens)}")


class LlamaForSequenceClassification(LlamaForCausalLM):
    """The decoder, then score [num_labels, hidden] over the pooled (last) token."""

    config_cls = ClassifierConfig
    is_pooling_model = True
    default_pooling_type = "LAST"

    def __init__(self, cfg: ClassifierConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        if cfg.classifier_from_token:  # a causal LM's checkpoint: score from lm_head's rows
            self.zero_when_absent = ("score.weight",)
        else:
            del self.lm_head  # no vocabulary projection in a classifier's checkpoint
        self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)

    def score_from_token_rows(self, token_ids: list[int]) -> None:
        """vLLM's causal LM turned classifier: score's rows are lm_head's rows of token_ids
        (no_post_processing), or the second's minus the first's (from_2_way_softmax: the
        sigmoid of that logit is the second token's probability of the two); lm_head goes."""
        rows = self.lm_head.weight[token_ids].float()
        if self.config.score_method == "from_2_way_softmax":
            rows = rows[1:] - rows[:1]
        with torch.no_grad():
            self.score.weight.copy_(rows)
        del self.lm_head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """A classifier generates nothing."""
        raise ValueError("a sequence classifier has no language-model head; use classify")

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """[B, hidden] pooled states -> logits [B, num_labels]."""
        return self.score(pooled)


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    """Qwen2's classifier: the decoder's defaults as Qwen2ForCausalLM reads them (biased q/k/v,
    no sliding window unless config.json turns it on)."""

    hf_defaults = Qwen2ForCausalLM.hf_defaults
    hf_unread = Qwen2ForCausalLM.hf_unread


class MistralForSequenceClassification(LlamaForSequenceClassification):
    """Mistral's classifier: the decoder's defaults as MistralForCausalLM reads them (vLLM
    serves every *ForSequenceClassification whose *ForCausalLM it has)."""

    hf_defaults = MistralForCausalLM.hf_defaults
    hf_unread = MistralForCausalLM.hf_unread


class Qwen3ForSequenceClassification(LlamaForSequenceClassification):
    """Qwen3's classifier (e.g. rerankers fine-tuned with a score head): Qwen3's decoder, with
    q/k norms, under Qwen3ForCausalLM's config defaults."""

    model_cls = Qwen3ForCausalLM.model_cls
    hf_defaults = Qwen3ForCausalLM.hf_defaults
    hf_unread = Qwen3ForCausalLM.hf_unread


class BareDecoderEmbedding:
    """Mixin over a *ForCausalLM for HF's bare decoder (e5-mistral-style embedding
    checkpoints): its hidden states, pooled at the last token unless the directory's
    sentence-transformers files say otherwise; the checkpoint's names lack the body's prefix
    and it has no lm_head."""

    is_pooling_model = True
    default_pooling_type = "LAST"

    def __init__(self, cfg: DecoderConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        del self.lm_head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """A bare decoder generates nothing."""
        raise ValueError("an embedding model has no language-model head; use embed")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """The checkpoint's name under the body (names saved with the prefix kept as they are)."""
        prefix = f"{cls.body_name}."
        return super().weight_name(hf_name if hf_name.startswith(prefix) else prefix + hf_name)


class LlamaEmbeddingModel(BareDecoderEmbedding, LlamaForCausalLM):
    """Llama's bare decoder."""


class Gemma3EmbeddingModel(BareDecoderEmbedding, Gemma3ForCausalLM):
    """Gemma 3's bare decoder (Gemma3TextModel: EmbeddingGemma), bidirectional where its
    config sets use_bidirectional_attention."""

    config_cls = Gemma3EmbeddingConfig


class MistralEmbeddingModel(LlamaEmbeddingModel):
    """Mistral's bare decoder under MistralForCausalLM's config defaults."""

    hf_defaults = MistralForCausalLM.hf_defaults
    hf_unread = MistralForCausalLM.hf_unread


class Qwen2EmbeddingModel(LlamaEmbeddingModel):
    """Qwen2's bare decoder under Qwen2ForCausalLM's config defaults (biased q/k/v)."""

    hf_defaults = Qwen2ForCausalLM.hf_defaults
    hf_unread = Qwen2ForCausalLM.hf_unread


class Qwen3EmbeddingModel(LlamaEmbeddingModel):
    """Qwen3's bare decoder (q/k norms) under Qwen3ForCausalLM's config defaults."""

    model_cls = Qwen3ForCausalLM.model_cls
    hf_defaults = Qwen3ForCausalLM.hf_defaults
    hf_unread = Qwen3ForCausalLM.hf_unread
