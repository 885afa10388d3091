"""RoBERTa-family encoders (RoBERTa, XLM-RoBERTa: bge-m3, e5, bge-reranker) on BERT's blocks.

What differs from BERT: positions start after the padding id (HF's position ids of an unpadded
sequence are pad_token_id + 1 + i), the weights sit under "roberta.", and the classifier is
RobertaClassificationHead (dense, tanh, out_proj over the first token) with no pooler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compiled_llm.models.bert import BertConfig, BertEmbeddings, BertModel


@dataclass
class RobertaConfig(BertConfig):
    """BertConfig plus the padding id that positions are offset by."""

    pad_token_id: int = 1

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> RobertaConfig:
        """BertConfig.from_hf, with pad_token_id (1 where the config has none)."""
        base = BertConfig.from_hf(hf_config, **defaults)
        pad = hf_config.get("pad_token_id")
        return cls(**vars(base), pad_token_id=1 if pad is None else int(pad))


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings read at position pad_token_id + 1 + i (HF's unpadded position ids)."""

    def __init__(self, cfg: RobertaConfig) -> None:
        super().__init__(cfg)
        self.position_offset = cfg.pad_token_id + 1

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids (token types in the high bits), positions [T] -> [T, hidden]."""
        return super().forward(input_ids, positions + self.position_offset)


class RobertaModel(BertModel):
    """The encoder as a pooling model: forward -> per-token hidden states [T, hidden]."""

    config_cls = RobertaConfig

    def __init__(self, cfg: RobertaConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.embeddings = RobertaEmbeddings(cfg)
        # one token type (RoBERTa's): a tokenizer's pair types are not read, as HF's default
        self.token_type_shift = self.token_type_shift if cfg.type_vocab_size > 1 else None

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor, or None to skip it."""
        return super().weight_name(hf_name.removeprefix("roberta."))


class RobertaClassificationHead(nn.Module):
    """dense, tanh, out_proj over each sequence's first token (<s>)."""

    def __init__(self, cfg: RobertaConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        """[B, hidden] -> logits [B, num_labels]."""
        return self.out_proj(torch.tanh(self.dense(first_token)))


class RobertaForSequenceClassification(RobertaModel):
    """RobertaModel + its classification head: classify(first-token states) -> logits."""

    skipped_prefixes = ()

    def __init__(self, cfg: RobertaConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.classifier = RobertaClassificationHead(cfg)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """[B, hidden] first-token states -> logits [B, num_labels]."""
        return self.classifier(pooled)
