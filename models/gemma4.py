"""Gemma 4 text decoder (Gemma4ForCausalLM: gemma-4 E2B, E4B, 26B-A4B, 31B): Gemma 3's layer with
q/k/v norms and unit attention scale, wider global layers on proportional RoPE (keys as values
where attention_k_eq_v), per-layer input embeddings (PLE), later layers attending over an
earlier layer's KV cache (attention_no_write on it), a dense MLP beside routed experts (the
fused MoE op), a scalar per layer. Config reading: gemma4_config.py."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from compiled_llm.attention import attention, attention_no_write
from compiled_llm.models.gemma3 import Gemma3ForCausalLM
from compiled_llm.models.gemma4_config import Gemma4Config
from compiled_llm.models.gemma4_tp import check_tensor_parallel, shard_attention, shard_layer
from compiled_llm.models.layers import ACTIVATIONS, Float32ScaleRMSNorm, GatedMLP
from compiled_llm.models.moe import FusedMoE
from compiled_llm.models.moe_routing import softmax_topk
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary, local_rotary_embedding

Rope = tuple[torch.Tensor, torch.Tensor]
KV = dict[int, tuple[torch.Tensor, torch.Tensor]]  # producer layer -> its (k, v) [T, Hkv, D]


def unit_rms_norm(hidden: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (v_norm, the router's norm), in float32, cast back."""
    hidden_f32 = hidden.float()
    return (hidden_f32 * torch.rsqrt(hidden_f32.pow(2).mean(-1, keepdim=True) + eps)).to(
        hidden.dtype)


class Gemma4Attention(nn.Module):
    """q/k normed per head then rotated, v normed without a weight, scale 1; a KV-shared layer
    has only q_proj / q_norm / o_proj and attends over its source layer's cache."""

    def __init__(self, cfg: Gemma4Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.kv_source = layer_idx, cfg.kv_source(layer_idx)
        self.num_heads, (self.num_kv_heads, self.head_dim) = (cfg.num_attention_heads,
                                                              cfg.layer_shape(layer_idx))
        self.sliding_window, self.eps = cfg.layer_window(layer_idx), cfg.rms_norm_eps
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, q_size, bias=bias)
        self.q_norm = Float32ScaleRMSNorm(self.head_dim, cfg.rms_norm_eps)
        if self.kv_source == layer_idx:  # transformers' shared layers have no K/V weights
            self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=bias)
            if not cfg.attention_k_eq_v or cfg.is_sliding(layer_idx):
                self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=bias)
            self.k_norm = Float32ScaleRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor, rope: Rope, shared_kv: KV) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; a cache-writing layer leaves its (k, v) in
        shared_kv for the layers that read its cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        if self.kv_source != self.layer_idx:
            q, _ = apply_rotary(self.q_norm(q), q[:, :0], rope)  # q alone turns
            k, v = shared_kv[self.kv_source]  # read where there is no cache (pooling runs)
            out = attention_no_write(q, k, v, self.kv_source, 1.0, self.sliding_window)
            return self.o_proj(out.flatten(1))
        k = self.k_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v_proj = getattr(self, "v_proj", None)  # None: attention_k_eq_v's full layers
        v = k if v_proj is None else v_proj(hidden).view(-1, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(self.q_norm(q), self.k_norm(k), rope)
        v = unit_rms_norm(v, self.eps)
        shared_kv[self.layer_idx] = (k, v)
        out = attention(q, k, v, self.layer_idx, 1.0, self.sliding_window)
        return self.o_proj(out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by heads in this layer's shape (models/gemma4_tp.py)."""
        shard_attention(self, sharder, prefix)


class Gemma4Router(nn.Module):
    """The MoE block's router: the unweighted norm of the layer input times scale / sqrt(hidden),
    softmax top-k renormalised, each weight times its expert's per_expert_scale."""

    def __init__(self, cfg: Gemma4Config) -> None:
        super().__init__()
        self.top_k, self.eps = cfg.moe.num_experts_per_tok, cfg.rms_norm_eps
        self.root_size = cfg.hidden_size**-0.5
        self.proj = nn.Linear(cfg.hidden_size, cfg.moe.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.moe.num_experts))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, hidden] -> (weights float32, expert ids) [T, K]."""
        hidden = unit_rms_norm(hidden, self.eps) * self.scale * self.root_size
        weights, ids = softmax_topk(self.proj(hidden), self.top_k, True)
        return weights * self.per_expert_scale[ids], ids


class Gemma4DecoderLayer(nn.Module):
    """Gemma 3's norms around attention and the MLP (plus the routed experts, each normed, where
    enable_moe_block), then the per-layer input's gated residual, all times layer_scalar."""

    def __init__(self, cfg: Gemma4Config, layer_idx: int) -> None:
        super().__init__()
        self.sliding, self.layer_idx = cfg.is_sliding(layer_idx), layer_idx
        self.self_attn = Gemma4Attention(cfg, layer_idx)
        wide = cfg.use_double_wide_mlp and cfg.kv_source(layer_idx) != layer_idx
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size * (2 if wide else 1), False,
                            cfg.hidden_act)
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        self.router = self.experts = None
        if cfg.moe is not None:
            self.router = Gemma4Router(cfg)
            self.experts = FusedMoE(cfg.moe.num_experts, cfg.hidden_size,
                                    cfg.moe.moe_intermediate_size, activation=cfg.moe_activation)
            norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                      "pre_feedforward_layernorm_2"]
        for name in norms:
            setattr(self, name, Float32ScaleRMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.per_layer_input_gate = None
        if cfg.hidden_size_per_layer_input:
            ple = cfg.hidden_size_per_layer_input
            self.act_fn = ACTIVATIONS[cfg.hidden_act]
            self.per_layer_input_gate = nn.Linear(cfg.hidden_size, ple, bias=False)
            self.per_layer_projection = nn.Linear(ple, cfg.hidden_size, bias=False)
            self.post_per_layer_input_norm = Float32ScaleRMSNorm(cfg.hidden_size,
                                                                 cfg.rms_norm_eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(self, hidden: torch.Tensor, rope: Rope, shared_kv: KV,
                per_layer_input: torch.Tensor | None) -> torch.Tensor:
        """hidden [T, hidden], per_layer_input [T, ple] (None without PLE) -> [T, hidden]."""
        attn = self.self_attn(self.input_layernorm(hidden), rope, shared_kv)
        residual = hidden + self.post_attention_layernorm(attn)
        hidden = self.mlp(self.pre_feedforward_layernorm(residual))
        if self.experts is not None:  # the experts read the layer's residual, not the MLP's
            weights, ids = self.router(residual)
            routed = self.experts(self.pre_feedforward_layernorm_2(residual), weights, ids)
            hidden = (self.post_feedforward_layernorm_1(hidden)
                      + self.post_feedforward_layernorm_2(routed))
        hidden = residual + self.post_feedforward_layernorm(hidden)
        if self.per_layer_input_gate is not None:
            gated = self.act_fn(self.per_layer_input_gate(hidden)) * per_layer_input
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return hidden * self.layer_scalar

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism of attention, MLP and experts (models/gemma4_tp.py)."""
        shard_layer(self, sharder, prefix)


class Gemma4Model(nn.Module):
    """The embedding scaled by sqrt(hidden_size), the per-layer inputs (PLE), the layers on
    their type's rotary table, the final norm."""

    layer_cls: type[nn.Module] = Gemma4DecoderLayer  # Gemma 3n's AltUp layer reuses the rest

    def __init__(self, cfg: Gemma4Config, max_len: int) -> None:
        super().__init__()
        self.num_layers, self.ple = cfg.num_hidden_layers, cfg.hidden_size_per_layer_input
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(hidden_size) rounded to the weights' dtype first, as transformers' Gemmas do
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size**0.5), persistent=False)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = Float32ScaleRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(dataclasses.replace(
            cfg, head_dim=cfg.global_head_dim), max_len)
        self.local_rotary_emb = local_rotary_embedding(cfg, max_len)
        if self.ple:
            packed = cfg.num_hidden_layers * self.ple  # every layer's input in one row
            self.embed_tokens_per_layer = nn.Embedding(cfg.vocab_size_per_layer_input, packed)
            self.register_buffer("per_layer_embed_scale", torch.tensor(self.ple**0.5),
                                 persistent=False)
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, packed, bias=False)
            self.projection_scale = cfg.hidden_size**-0.5
            self.per_layer_projection_norm = Float32ScaleRMSNorm(self.ple, cfg.rms_norm_eps)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[T, layers, ple]: (norm(projection of the embeddings) + the token's own per-layer
        embedding) / sqrt(2)."""
        own = self.embed_tokens_per_layer(input_ids)
        own = own * self.per_layer_embed_scale.to(own.dtype)
        own = own.view(-1, self.num_layers, self.ple)  # [T, L, ple]
        projected = self.per_layer_model_projection(embeds) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.view(-1, self.num_layers, self.ple))
        return (projected + own) * 2.0**-0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        hidden = hidden * self.embed_scale.to(hidden.dtype)
        per_layer = self.per_layer_inputs(input_ids, hidden) if self.ple else None
        ropes = {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}
        shared_kv: KV = {}
        for i, layer in enumerate(self.layers):
            layer_input = None if per_layer is None else per_layer[:, i]
            hidden = layer(hidden, ropes[layer.sliding], shared_kv, layer_input)
        return self.norm(hidden)


class Gemma4ForCausalLM(Gemma3ForCausalLM):
    """Gemma 4 for causal LM: Gemma 3's contract (soft-capped logits) over Gemma4Model; the
    stacked experts load into FusedMoE, a KV-shared layer's K/V tensors (which some checkpoints
    carry) are skipped. Tensor parallelism shards each layer in its own head shape
    (models/gemma4_tp.py); LoRA and pipeline parallelism are refused (layers of different head
    shapes; no Llama layer loop)."""

    model_cls = Gemma4Model
    config_cls = Gemma4Config
    check_tensor_parallel = staticmethod(check_tensor_parallel)
    supports_lora = False  # full layers' wider heads, shared and keys-as-values layers
    hf_defaults = {**Gemma3ForCausalLM.hf_defaults, "sliding_window": 512,
                   "num_key_value_heads": 4, "hidden_size_per_layer_input": 256,
                   "vocab_size_per_layer_input": 262144}
    # Gemma4TextConfig reads the MoE block's sizes by its own names, rope only per layer type
    hf_unread = ("hidden_act", "qkv_bias", "o_proj_bias", "mlp_bias", "use_sliding_window",
                 "max_window_layers", "num_local_experts", "num_experts_per_tok",
                 "norm_topk_prob", "shared_expert_intermediate_size", "decoder_sparse_step",
                 "mlp_only_layers", "rope_theta", "rope_scaling", "partial_rotary_factor",
                 "rope_local_base_freq", "sliding_window_pattern", "query_pre_attn_scalar",
                 "attn_logit_softcapping")
    expert_names = {".experts.gate_up_proj": ".experts.w13_weight",
                    ".experts.down_proj": ".experts.w2_weight"}

    def weight_name(self, hf_name: str) -> str | None:
        """The identity, but the stacked experts' names and a KV-shared layer's K/V (None)."""
        for theirs, ours in self.expert_names.items():
            if hf_name.endswith(theirs):
                return hf_name[: -len(theirs)] + ours
        parts = hf_name.split(".")
        if (len(parts) > 4 and parts[:2] == ["model", "layers"] and parts[3] == "self_attn"
                and parts[4] in ("k_proj", "v_proj", "k_norm", "v_norm")
                and self.config.kv_source(int(parts[2])) != int(parts[2])):
            return None
        return super().weight_name(hf_name)
