"""HRM-Text (HrmTextForCausalLM): two stacks of MHA Llama layers (sigmoid-gated attention output,
weightless norms, one more after each stack) unrolled: z_H the scaled embeddings, z_L z_L_init;
H_cycles times L_module runs L_cycles times on z_L + z_H, then H_module on z_H + z_L; each run its
own KV cache slots. prefix_lm needs token_type_ids, which generation never passes: causal, as in
transformers' generate."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import ACTIVATIONS
from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.nanochat import NanoChatRMSNorm
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary

ARCH = "HrmTextForCausalLM"


@dataclasses.dataclass
class HrmTextConfig(DecoderConfig):
    """DecoderConfig (num_hidden_layers: every KV cache slot of the unrolled recurrence) plus
    the stacks' depth, the two cycle counts and the embedding scale."""

    num_layers_per_stack: int = 1
    h_cycles: int = 2
    l_cycles: int = 3
    embedding_scale: float = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> HrmTextConfig:
        """transformers' HrmTextConfig keys (num_hidden_layers the per-stack depth where
        num_layers_per_stack is unset, as transformers reads a legacy config); ValueError
        naming a cycle count that is not an int."""
        hf = {**defaults, **hf_config}
        h_cycles, l_cycles = hf.get("H_cycles"), hf.get("L_cycles")
        for key, value, least in (("H_cycles", h_cycles, 1), ("L_cycles", l_cycles, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{key} {value!r} is not supported for {ARCH}: give an int "
                                 f">= {least}")
        per_stack = hf.get("num_layers_per_stack") or hf["num_hidden_layers"]
        scale = hf.get("embedding_scale")
        base = super().from_hf(
            {**hf_config, "num_hidden_layers": per_stack * h_cycles * (l_cycles + 1)},
            **defaults)
        return dataclasses.replace(
            base, num_layers_per_stack=per_stack, h_cycles=h_cycles, l_cycles=l_cycles,
            embedding_scale=float(1.0 / hf["initializer_range"] if scale is None else scale))


class FusedPart(NamedTuple):
    """Where a checkpoint tensor goes: part `part` of `parts` (split along dim 0) of `name`."""

    name: str
    part: int
    parts: int

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The view of param this tensor fills."""
        return param.chunk(self.parts, dim=0)[self.part]


class HrmTextAttention(nn.Module):
    """MHA with RoPE, q/k/v and the gate from one gqkv_proj (gate, q, k, v rows: the
    checkpoint's), the output times sigmoid(gate) before o_proj; the caller names the slot."""

    def __init__(self, cfg: HrmTextConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        width = cfg.num_attention_heads * cfg.head_dim
        self.gqkv_proj = nn.Linear(cfg.hidden_size, 4 * width, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(width, cfg.hidden_size, bias=cfg.attention_bias)

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """This rank's heads of each of gqkv_proj's gate, q, k and v parts; o_proj's columns."""
        first, count = sharder.query_heads()
        width, start, size = self.num_heads * self.head_dim, first * self.head_dim, \
            count * self.head_dim
        sharder.fused_column(f"{prefix}.gqkv_proj", self.gqkv_proj,
                             [(part * width, start, size) for part in range(4)])
        sharder.row(f"{prefix}.o_proj", self.o_proj, start, size)
        self.num_heads = count

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                slot: int) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes K/V into cache slot `slot`."""
        gqkv = self.gqkv_proj(hidden).view(-1, 4, self.num_heads, self.head_dim)  # [T, 4, H, D]
        gate, q, k, v = gqkv.unbind(1)
        q, k = apply_rotary(q, k, rope)
        attn_out = attention(q, k, v, slot, self.scale, -1)
        return self.o_proj((torch.sigmoid(gate) * attn_out).flatten(1))  # [T, H*D]


class HrmTextMLP(nn.Module):
    """down_proj(act(gate) * up) with gate and up the halves of gate_up_proj (the
    checkpoint's), biased where mlp_bias says."""

    def __init__(self, cfg: HrmTextConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size,
                                      bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act_fn = ACTIVATIONS[cfg.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(hidden).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(self.act_fn(gate) * up)


class HrmTextDecoderLayer(nn.Module):
    """Pre-norm layer (weightless norms): x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: HrmTextConfig) -> None:
        super().__init__()
        self.self_attn = HrmTextAttention(cfg)
        self.mlp = HrmTextMLP(cfg)
        self.input_layernorm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                slot: int) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, slot)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class HrmTextStack(nn.Module):
    """num_layers_per_stack layers, then a weightless final_norm; layer i attends through
    cache slot first_slot + i."""

    def __init__(self, cfg: HrmTextConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(HrmTextDecoderLayer(cfg)
                                    for _ in range(cfg.num_layers_per_stack))
        self.final_norm = NanoChatRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                first_slot: int) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, rope, first_slot + i)
        return self.final_norm(hidden)


class HrmTextModel(nn.Module):
    """The scaled embedding, L_module and H_module unrolled over the cycles (Python ints: one
    static graph), z_L_init; the output is the last z_H."""

    def __init__(self, cfg: HrmTextConfig, max_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(cfg, max_len)
        self.L_module = HrmTextStack(cfg)
        self.H_module = HrmTextStack(cfg)
        self.z_L_init = nn.Parameter(torch.zeros(cfg.hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        cfg, per_stack = self.cfg, self.cfg.num_layers_per_stack
        z_high = self.embed_tokens(input_ids) * cfg.embedding_scale  # [T, hidden]
        rope = self.rotary_emb(positions)
        z_low = self.z_L_init.expand_as(z_high)  # [T, hidden]
        for h in range(cfg.h_cycles):
            first = h * (cfg.l_cycles + 1)  # this cycle's first stack run
            for low in range(cfg.l_cycles):
                z_low = self.L_module(z_low + z_high, rope, (first + low) * per_stack)
            z_high = self.H_module(z_high + z_low, rope, (first + cfg.l_cycles) * per_stack)
        return z_high


class HrmTextForCausalLM(LlamaForCausalLM):
    """HRM-Text for causal LM: the Llama contract over HrmTextModel. LoRA and pipeline
    parallelism are refused by name (the stacks are no layer loop). Loads the checkpoints'
    fused attn.gqkv_proj and mlp.gate_up_proj, and transformers' split names (biases among
    them) into their parts; under tensor parallelism either reads each part's rows."""

    model_cls = HrmTextModel
    config_cls = HrmTextConfig
    supports_lora = False
    hf_defaults = {"head_dim": 128, "H_cycles": 2, "L_cycles": 3, "rms_norm_eps": 1e-6,
                   "initializer_range": 0.02, "max_position_embeddings": 2048}
    # transformers' HrmText is MHA (num_key_value_heads unread), no window, no experts
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("num_key_value_heads", "qkv_bias", "o_proj_bias")
    _parts = {".self_attn.gate_proj.": (".self_attn.gqkv_proj.", 0, 4),
              ".self_attn.q_proj.": (".self_attn.gqkv_proj.", 1, 4),
              ".self_attn.k_proj.": (".self_attn.gqkv_proj.", 2, 4),
              ".self_attn.v_proj.": (".self_attn.gqkv_proj.", 3, 4),
              ".mlp.gate_proj.": (".mlp.gate_up_proj.", 0, 2),
              ".mlp.up_proj.": (".mlp.gate_up_proj.", 1, 2)}

    @classmethod
    def weight_name(cls, hf_name: str) -> str | FusedPart | None:
        """Our parameter, or the part of a fused one, for a checkpoint tensor."""
        hf_name = hf_name.replace(".attn.", ".self_attn.")
        for theirs, (ours, part, parts) in cls._parts.items():
            if theirs in hf_name:
                return FusedPart(hf_name.replace(theirs, ours), part, parts)
        return super().weight_name(hf_name)
