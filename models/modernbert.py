"""ModernBERT encoders (ModernBertModel: gte-modernbert and other embedders;
ModernBertForSequenceClassification: rerankers, classifiers) in plain PyTorch: a fused Wqkv,
RoPE on a global and a local base, bidirectional attention whose local layers see keys within
local_attention // 2 on either side, pre-LayerNorms without bias, a GeGLU MLP (Wi, Wo).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.gemma3 import FULL, SLIDING, split_layer_rope
from compiled_llm.models.layers import ACTIVATIONS
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary, local_rotary_embedding


@dataclasses.dataclass
class ModernBertConfig(DecoderConfig):
    """DecoderConfig's shapes (heads, RoPE of the global layers, windowed layers) plus
    ModernBERT's own keys; sliding_window is our |q - k| < w bound of the local layers."""

    local_rope_theta: float = 10000.0
    norm_bias: bool = False
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    num_labels: int = 2
    id2label: dict | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> ModernBertConfig:
        """transformers' ModernBertConfig keys, in its 5.x spelling (rope_parameters per layer
        type) or 4.x's (global_rope_theta, local_rope_theta, global_attn_every_n_layers)."""
        hf = dict(hf_config)
        hf.setdefault("rope_theta", hf.get("global_rope_theta", 160000.0))
        hf.setdefault("rope_local_base_freq", hf.get("local_rope_theta", 10000.0))
        local_theta = split_layer_rope(hf, defaults)
        every = hf.get("global_attn_every_n_layers") or 3
        hf["layer_types"] = hf.get("layer_types") or [
            SLIDING if i % every else FULL for i in range(hf["num_hidden_layers"])]
        hf["sliding_window"] = (hf.get("local_attention") or 128) // 2 + 1
        hf.update(hidden_act=hf.get("hidden_activation") or "gelu",
                  rms_norm_eps=hf.get("norm_eps", 1e-5), num_key_value_heads=None)
        pooling = hf.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {pooling!r} is not supported (cls, mean)")
        id2label = {str(k): v for k, v in (hf.get("id2label") or {}).items()}
        return dataclasses.replace(
            super().from_hf(hf, **defaults), local_rope_theta=float(local_theta),
            norm_bias=bool(hf.get("norm_bias", False)), classifier_pooling=pooling,
            classifier_bias=bool(hf.get("classifier_bias", False)),
            classifier_activation=hf.get("classifier_activation") or "gelu",
            num_labels=hf.get("num_labels") or len(id2label) or 2, id2label=id2label)


def _layer_norm(cfg: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, bias=cfg.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, then LayerNorm (no position table: RoPE in every layer)."""

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = _layer_norm(cfg)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, hidden]."""
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    """Wqkv, RoPE, bidirectional attention through the op (windowed on local layers), Wo."""

    def __init__(self, cfg: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads = layer_idx, cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = cfg.layer_window(layer_idx)
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        qkv = self.Wqkv(hidden).view(-1, 3, self.num_heads, self.head_dim)  # [T, 3, H, D]
        q, k, v = qkv.unbind(1)
        q, k = apply_rotary(q, k, rope)
        out = attention(q, k, v, self.layer_idx, self.scale, self.sliding_window, False)
        return self.Wo(out.flatten(1))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi's first half through the activation times its second half, then Wo."""

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        up, gate = self.Wi(hidden).chunk(2, dim=-1)
        return self.Wo(self.act(up) * gate)


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks (the first layer's attention reads the embeddings'
    norm: no attn_norm there)."""

    def __init__(self, cfg: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.sliding = cfg.layer_window(layer_idx) > 0
        self.attn_norm = nn.Identity() if layer_idx == 0 else _layer_norm(cfg)
        self.attn = ModernBertAttention(cfg, layer_idx)
        self.mlp_norm = _layer_norm(cfg)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """[T, hidden] -> [T, hidden]."""
        hidden = hidden + self.attn(self.attn_norm(hidden), rope)
        return hidden + self.mlp(self.mlp_norm(hidden))


class ModernBertBody(nn.Module):
    """HF's ModernBertModel: embeddings, the layers on their two rotary tables, final_norm."""

    def __init__(self, cfg: ModernBertConfig, max_len: int) -> None:
        super().__init__()
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.final_norm = _layer_norm(cfg)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)
        self.local_rotary_emb = local_rotary_embedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden]."""
        hidden = self.embeddings(input_ids)
        ropes = {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}
        for layer in self.layers:
            hidden = layer(hidden, ropes[layer.sliding])
        return self.final_norm(hidden)


class ModernBertModel(nn.Module):
    """The encoder as a pooling model: forward -> per-token hidden states [T, hidden]."""

    config_cls = ModernBertConfig
    hf_defaults = {"rope_local_base_freq": 10000.0}
    is_pooling_model = True
    default_pooling_type = "CLS"

    def __init__(self, cfg: ModernBertConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = ModernBertBody(cfg, max_len or cfg.max_position_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden]."""
        return self.model(input_ids, positions)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our name for a checkpoint tensor: the body's under "model." (a bare encoder's are
        saved without it); a masked-LM head's tensors are skipped."""
        if hf_name.startswith(("head.", "decoder.")) and cls is ModernBertModel:
            return None
        ours = hf_name.startswith(("model.", "head.", "classifier."))
        return hf_name if ours else f"model.{hf_name}"


class ModernBertPredictionHead(nn.Module):
    """dense, activation, LayerNorm over the pooled states."""

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.classifier_bias)
        self.act = ACTIVATIONS[cfg.classifier_activation]
        self.norm = _layer_norm(cfg)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """[B, hidden] -> [B, hidden]."""
        return self.norm(self.act(self.dense(pooled)))


class ModernBertForSequenceClassification(ModernBertModel):
    """ModernBertModel + head + classifier over the first token or the mean (config's
    classifier_pooling): classify(pooled) -> logits."""

    def __init__(self, cfg: ModernBertConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        self.default_pooling_type = "CLS" if cfg.classifier_pooling == "cls" else "MEAN"
        self.head = ModernBertPredictionHead(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """[B, hidden] pooled states -> logits [B, num_labels]."""
        return self.classifier(self.head(pooled))
