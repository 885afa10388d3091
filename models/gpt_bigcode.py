"""GPTBigCode decoder (GPTBigCodeForCausalLM: StarCoder 1, SantaCoder, tiny_starcoder): GPT-2's
layout (learned positions wpe, ln_1 / ln_2 / ln_f, c_attn, c_fc -> gelu_pytorch_tanh -> c_proj,
a tied head) over nn.Linear weights (not Conv1D), with multi-query attention where multi_query
(one KV head: c_attn's rows are q [hidden], then k and v [head_dim] each); without it, c_attn's
rows are laid out per head as [H, 3, D]. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.fused_heads import shard_grouped_qkv
from compiled_llm.models.gpt2 import (
    Conv1DWeight,
    GPT2Attention,
    GPT2Block,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
)


@dataclasses.dataclass
class GPTBigCodeConfig(GPT2Config):
    """GPT2Config plus multi_query (one KV head for every query head)."""

    multi_query: bool = True

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GPTBigCodeConfig:
        """The keys transformers' GPTBigCodeConfig reads: GPT-2's spelling plus multi_query."""
        base = super().from_hf(hf_config, **defaults)
        multi_query = bool(hf_config.get("multi_query", defaults.get("multi_query", True)))
        kv_heads = 1 if multi_query else base.num_attention_heads
        return dataclasses.replace(base, multi_query=multi_query, num_key_value_heads=kv_heads)


class GPTBigCodeAttention(GPT2Attention):
    """Multi-query (one KV head) or multi-head self-attention over one c_attn, no RoPE."""

    def __init__(self, cfg: GPTBigCodeConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.multi_query = cfg.multi_query
        kv_size = cfg.num_key_value_heads * cfg.head_dim
        self.c_attn = nn.Linear(cfg.hidden_size, cfg.hidden_size + 2 * kv_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        qkv = self.c_attn(hidden)  # [T, hidden + 2 * Hkv * D]
        if self.multi_query:  # a config constant: one graph per model
            q, k, v = qkv.split([self.embed_dim, self.head_dim, self.head_dim], -1)
            q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
            k, v = k.unsqueeze(1), v.unsqueeze(1)  # [T, 1, D]
        else:
            qkv = qkv.view(-1, self.num_heads, 3 * self.head_dim)  # [T, H, 3D]
            q, k, v = qkv.chunk(3, dim=-1)  # [T, H, D] each: the rows are [H, 3, D]
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)  # [T, H, D]
        return self.c_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism (called by the block's): c_attn as one KV group [q..., k, v]
        (multi_query: this rank's q rows, k and v replicated) or per head [H, 3, D] (this
        rank's heads' rows), c_proj by columns."""
        shard_grouped_qkv(sharder, prefix, self, "c_attn", "c_proj")
        self.embed_dim = self.num_heads * self.head_dim  # this rank's q width


class GPTBigCodeBlock(GPT2Block):
    """GPT-2's block over GPTBigCode's attention."""

    attention_cls = GPTBigCodeAttention
    conv1d_weights = False  # nn.Linear weights


class GPTBigCodeModel(GPT2Model):
    """GPT-2's body (wte, wpe, h, ln_f) over GPTBigCode blocks."""

    block_cls = GPTBigCodeBlock


class GPTBigCodeForCausalLM(GPT2LMHeadModel):
    """GPTBigCode for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden];
    the head tied to wte unless tie_word_embeddings is false; tensor parallelism by heads (the
    one KV head replicated). Pipeline parallelism (not the Llama family's layers) is refused by
    name, and LoRA by the module it lacks."""

    config_cls = GPTBigCodeConfig
    body_cls = GPTBigCodeModel
    # transformers' GPTBigCodeConfig defaults (config.json may leave any of them out); its
    # attention_softmax_in_fp32 and scale_attention_softmax_in_fp32 upcast the eager path's
    # scores to float32, as the attention op computes them anyway
    hf_defaults = {**GPT2LMHeadModel.hf_defaults, "activation_function": "gelu_pytorch_tanh",
                   "multi_query": True}
    # transformers' GPTBigCode has no scale_attn_by_inverse_layer_idx (GPT-2's alone)
    hf_unread = ("scale_attn_by_inverse_layer_idx",)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """GPT-2's names (`transformer.` added to a base model's), the weights as stored."""
        target = super().weight_name(hf_name)
        return target.name if isinstance(target, Conv1DWeight) else target
