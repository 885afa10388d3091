"""BERT-family encoders in plain PyTorch: BertModel (embeddings) and BertForSequenceClassification.

Absolute position and token type embeddings, post-LayerNorm blocks, a GELU MLP, bidirectional
attention through the one attention op (causal=False, no KV cache). HF's module names; token
types ride in input_ids' high bits (as vLLM packs them), so forward stays (input_ids, positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention

TOKEN_TYPE_SHIFT = 30  # input_ids | token_type << 30; vocabularies stay below 2**30


def encode_token_types(input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
    """input_ids with each token's type in bit 30 and up (what BertEmbeddings reads back)."""
    return input_ids | (token_type_ids.to(input_ids.dtype) << TOKEN_TYPE_SHIFT)


@dataclass
class BertConfig:
    """Shapes and constants of a BERT encoder, read from an HF config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    num_labels: int = 2
    id2label: dict[str, str] = field(default_factory=dict)
    architecture: str = ""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_key_value_heads(self) -> int:
        """BERT has no GQA: as many K/V heads as query heads."""
        return self.num_attention_heads

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> BertConfig:
        """Read an HF config dict; ValueError for what this file does not implement."""
        kind = hf_config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"position_embedding_type {kind!r} is not supported (absolute is)")
        act = hf_config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported; have {sorted(_ACTIVATIONS)}")
        id2label = {str(k): v for k, v in (hf_config.get("id2label") or {}).items()}
        return cls(
            vocab_size=hf_config["vocab_size"], hidden_size=hf_config["hidden_size"],
            intermediate_size=hf_config["intermediate_size"],
            num_hidden_layers=hf_config["num_hidden_layers"],
            num_attention_heads=hf_config["num_attention_heads"],
            max_position_embeddings=hf_config.get("max_position_embeddings", 512),
            type_vocab_size=hf_config.get("type_vocab_size", 2),
            layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12), hidden_act=act,
            num_labels=hf_config.get("num_labels") or len(id2label) or 2, id2label=id2label,
            architecture=(hf_config.get("architectures") or [""])[0],
        )


_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu,
                "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class BertEmbeddings(nn.Module):
    """word + absolute position + token type embeddings, then LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids (token types in the high bits), positions [T] -> [T, hidden]."""
        token_types = input_ids >> TOKEN_TYPE_SHIFT
        ids = input_ids & ((1 << TOKEN_TYPE_SHIFT) - 1)
        hidden = (self.word_embeddings(ids) + self.position_embeddings(positions)
                  + self.token_type_embeddings(token_types))
        return self.LayerNorm(hidden)


class BertSelfAttention(nn.Module):
    """query/key/value projections and bidirectional attention through the op."""

    def __init__(self, cfg: BertConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads = layer_idx, cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> attended [T, hidden] (every token sees its whole sequence)."""
        q = self.query(hidden).view(-1, self.num_heads, self.head_dim)
        k = self.key(hidden).view(-1, self.num_heads, self.head_dim)
        v = self.value(hidden).view(-1, self.num_heads, self.head_dim)
        return attention(q, k, v, self.layer_idx, self.scale, -1, False).flatten(1)


class BertSelfOutput(nn.Module):
    """dense, then LayerNorm over the residual sum (post-norm); HF's attention.output and
    output modules share this shape."""

    def __init__(self, cfg: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """LayerNorm(dense(hidden) + residual)."""
        return self.LayerNorm(self.dense(hidden) + residual)


class BertAttention(nn.Module):
    """self-attention and its output block."""

    def __init__(self, cfg: BertConfig, layer_idx: int) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg, layer_idx)
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm attention block."""
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    """The MLP's up projection and activation."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """act(dense(hidden))."""
        return self.act(self.dense(hidden))


class BertLayer(nn.Module):
    """attention block, then MLP block, each post-LayerNorm."""

    def __init__(self, cfg: BertConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = BertAttention(cfg, layer_idx)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        hidden = self.attention(hidden)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    """The stack of layers."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg, i) for i in range(cfg.num_hidden_layers))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Run every layer."""
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertPooler(nn.Module):
    """tanh(dense(first token)): the head BERT's classifier reads."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """[B, hidden] of each sequence's first token -> [B, hidden]."""
        return torch.tanh(self.dense(cls_hidden))


class BertModel(nn.Module):
    """The encoder as a pooling model: forward -> per-token hidden states [T, hidden]."""

    hf_defaults: dict = {}
    config_cls = BertConfig
    is_pooling_model = True
    default_pooling_type = "CLS"
    token_type_shift = TOKEN_TYPE_SHIFT
    skipped_prefixes: tuple[str, ...] = ("pooler.",)  # a classifier's head: unused here

    def __init__(self, cfg: BertConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden]."""
        return self.encoder(self.embeddings(input_ids, positions))

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor, or None to skip it (position_ids)."""
        name = hf_name.removeprefix("bert.")
        if name.endswith("position_ids") or name.startswith(cls.skipped_prefixes):
            return None
        return name


class BertForSequenceClassification(BertModel):
    """BertModel + classifier over the pooled first token: classify(pooled) -> logits."""

    skipped_prefixes = ()

    def __init__(self, cfg: BertConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.pooler = BertPooler(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """[B, hidden] first-token states -> logits [B, num_labels]."""
        return self.classifier(self.pooler(pooled))
