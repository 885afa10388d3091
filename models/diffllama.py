"""DiffLlama (DiffLlamaForCausalLM): the Llama layer with differential attention, two softmax
maps (the first and second halves of the q and k heads) over values twice a head wide, the
second map subtracted times a learned lambda, then a weightless RMSNorm over each head pair."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.llama import (
    LayersOfSlots,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


@dataclasses.dataclass
class DiffLlamaConfig(DecoderConfig):
    """DecoderConfig whose num_hidden_layers counts attention maps, two per decoder layer (the
    KV cache holds one layer per map); num_layers is transformers' num_hidden_layers."""

    @property
    def num_layers(self) -> int:
        """Decoder layers (transformers' num_hidden_layers)."""
        return self.num_hidden_layers // 2

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DiffLlamaConfig:
        """DecoderConfig.from_hf, then two cache layers per decoder layer; ValueError naming
        num_key_value_heads unless the KV heads split into two maps, attention_dropout unless
        0 (transformers refuses it as well)."""
        base = super().from_hf(hf_config, **defaults)
        if base.num_key_value_heads % 2:
            raise ValueError(f"num_key_value_heads {base.num_key_value_heads} is not supported "
                             "for DiffLlamaForCausalLM: the two maps split the KV heads in half")
        if hf_config.get("attention_dropout") or 0.0:
            raise ValueError(f"attention_dropout {hf_config['attention_dropout']!r} is not "
                             "supported for DiffLlamaForCausalLM (transformers refuses it too)")
        return dataclasses.replace(base, num_hidden_layers=2 * base.num_hidden_layers)


class DiffLlamaAttention(LlamaAttention):
    """Differential attention of decoder layer `layer_idx` (cache layers 2i and 2i + 1): map m
    pairs q's and k's m-th half of heads; each value is [v head of the first half, the one of
    the second] (2D wide), served as the map's heads twice over v's own heads; out =
    (1 - lambda_init) * rms_norm(map_1 - lambda * map_2)."""

    def __init__(self, cfg: DiffLlamaConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.cache_layers = (2 * layer_idx, 2 * layer_idx + 1)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        self.eps = cfg.rms_norm_eps
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(cfg.head_dim)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: int) -> torch.Tensor:
        """Map m over q's and k's m-th half of heads -> [T, H/2, 2D]: each query head's map
        weighs its value pair (the v heads of both halves its k head's index selects)."""
        q_m, k_m = q.chunk(2, 1)[m], k.chunk(2, 1)[m]  # [T, H/2, D], [T, Hkv/2, D]
        # heads doubled: query head j + H/2 meets KV head j's twin in v's second half
        out = attention(torch.cat([q_m, q_m], 1), torch.cat([k_m, k_m], 1), v,
                        self.cache_layers[m], self.scale, -1)  # [T, H, D]
        return torch.cat(out.chunk(2, 1), -1)  # [T, H/2, 2D]

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes both maps' K/V into their caches."""
        q, k, v = self.qkv(hidden)
        q, k = self.rotate(q, k, rope)
        lambda_1 = torch.exp((self.lambda_q1 * self.lambda_k1).sum(-1, dtype=torch.float32))
        lambda_2 = torch.exp((self.lambda_q2 * self.lambda_k2).sum(-1, dtype=torch.float32))
        lambda_full = lambda_1.to(q.dtype) - lambda_2.to(q.dtype) + self.lambda_init
        diff = self.attend(q, k, v, 0) - lambda_full * self.attend(q, k, v, 1)
        normed = F.rms_norm(diff, diff.shape[-1:], eps=self.eps) * (1 - self.lambda_init)
        return self.o_proj(normed.flatten(1))  # [T, H/2 * 2D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by head pairs: q, k and v keep this rank's share of each half
        of their heads (so each map pairs them locally as on one rank), o_proj the columns of
        its query heads' pairs (2D each)."""
        dim, half_q, half_kv = self.head_dim, self.num_heads // 2, self.num_kv_heads // 2
        first, count = sharder.split(half_q, "num_attention_heads / 2")
        kv_first, kv_count = sharder.split(half_kv, "num_key_value_heads / 2")
        sharder.fused_column(f"{prefix}.q_proj", self.q_proj, [
            (0, first * dim, count * dim), (half_q * dim, first * dim, count * dim)])
        for name in ("k_proj", "v_proj"):
            sharder.fused_column(f"{prefix}.{name}", getattr(self, name), [
                (0, kv_first * dim, kv_count * dim), (half_kv * dim, kv_first * dim,
                                                      kv_count * dim)])
        sharder.row(f"{prefix}.o_proj", self.o_proj, 2 * first * dim, 2 * count * dim)
        self.num_heads, self.num_kv_heads = 2 * count, 2 * kv_count


class DiffLlamaDecoderLayer(LlamaDecoderLayer):
    """The Llama layer over differential attention."""

    attention_cls = DiffLlamaAttention


class DiffLlamaModel(LayersOfSlots, LlamaModel):
    """The Llama body over num_layers DiffLlama layers (two cache slots each)."""

    layer_cls = DiffLlamaDecoderLayer


class DiffLlamaForCausalLM(LlamaForCausalLM):
    """DiffLlama for causal LM: the Llama contract over DiffLlamaModel (tensor parallel by
    head pairs). Pipeline parallelism (two cache layers a layer) and LoRA are refused by
    name."""

    model_cls = DiffLlamaModel
    config_cls = DiffLlamaConfig
    supports_lora = False

    @staticmethod
    def check_tensor_parallel(config: DiffLlamaConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size unless it divides each half of the query
        and of the KV heads (the maps' pairs stay on one rank; no KV head replicated)."""
        for name, heads in (("num_attention_heads", config.num_attention_heads),
                            ("num_key_value_heads", config.num_key_value_heads)):
            if heads // 2 % world:
                raise ValueError(f"tensor_parallel_size {world} must divide half of {name} "
                                 f"{heads} for DiffLlamaForCausalLM (the maps' halves)")
    hf_defaults = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
                   "tie_word_embeddings": False, "attention_bias": False}
    # transformers' DiffLlama: no window, no experts, o_proj biased as q/k/v, the MLP never
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")
