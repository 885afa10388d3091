"""JetMoE (JetMoeForCausalLM): pre-norm layers of a mixture of attention heads (MoA: each
token's top-k experts own its query and output projections over one shared set of KV heads),
run densely with data-independent shapes, and a biased mixture-of-experts MLP; both routed by
softmax over the top-k logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import softmax_topk
from compiled_llm.models.rotary import apply_rotary

ARCH = "JetMoeForCausalLM"
LAYER_NORM_EPS = 1e-6  # transformers builds the layers' norms with their default eps


@dataclasses.dataclass
class JetMoeConfig(DecoderConfig):
    """DecoderConfig over JetMoE's keys: head_dim is kv_channels, num_attention_heads the
    num_key_value_heads * num_experts_per_tok query heads a token attends with, cfg.moe the
    experts both mixtures share in number and top-k (the MLP's of intermediate_size)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> JetMoeConfig:
        """transformers' JetMoeConfig keys; ValueError naming a field it cannot follow."""
        hf = {**defaults, **hf_config}
        act = hf.get("activation_function")
        if act not in ("silu", "swish"):  # compiled_llm::fused_moe is SiLU-gated
            raise ValueError(f"activation_function {act!r} is not supported for {ARCH}; "
                             "have ['silu']")
        experts, top_k = hf.get("num_local_experts"), hf.get("num_experts_per_tok")
        if not isinstance(experts, int) or not isinstance(top_k, int) or \
                not 1 <= top_k <= experts:
            raise ValueError(f"num_experts_per_tok {top_k!r} is not supported for {ARCH} with "
                             f"num_local_experts {experts!r}: give 1 to num_local_experts")
        if hf.get("head_dim", hf["kv_channels"]) != hf["kv_channels"]:  # its alias
            raise ValueError(f"head_dim {hf['head_dim']!r} is not supported beside kv_channels "
                             f"{hf['kv_channels']!r} for {ARCH}")
        return super().from_hf({
            **hf, "num_attention_heads": hf["num_key_value_heads"] * top_k,
            "head_dim": hf["kv_channels"], "hidden_act": "silu", "num_experts": experts,
            "moe_intermediate_size": hf["intermediate_size"], "norm_topk_prob": True})


class ParallelExperts(nn.Module):
    """One linear per expert, stacked: weight [E, out, in]."""

    def __init__(self, num_experts: int, in_size: int, out_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_size, in_size))


class JetMoeMoA(nn.Module):
    """The attention experts: router.layer scores them; input_linear [E, Hkv*D, hidden] are
    their query projections, output_linear [E, hidden, Hkv*D] their output ones; one bias.
    Every expert's queries are computed and the token's top-k gathered; every expert projects
    the outputs back, weighted by its routing weight (zero where not chosen)."""

    def __init__(self, cfg: JetMoeConfig) -> None:
        super().__init__()
        experts, width = cfg.moe.num_experts, cfg.num_key_value_heads * cfg.head_dim
        self.top_k = cfg.moe.num_experts_per_tok
        self.router = nn.Module()
        self.router.layer = nn.Linear(cfg.hidden_size, experts, bias=False)
        self.input_linear = ParallelExperts(experts, cfg.hidden_size, width)
        self.output_linear = ParallelExperts(experts, width, cfg.hidden_size)
        self.bias = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.output_sum = nn.Identity()  # a module: tensor parallelism all-reduces its output

    def map(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [T, hidden] -> (queries of the token's top-k experts [T, K, Hkv*D], their
        weights [T, K] (softmax over the top-k logits, hidden's dtype), expert ids [T, K])."""
        weights, ids = softmax_topk(self.router.layer(hidden), self.top_k, True)
        every = F.linear(hidden, self.input_linear.weight.flatten(0, 1))  # [T, E*Hkv*D]
        every = every.unflatten(-1, (self.input_linear.weight.shape[0], -1))  # [T, E, Hkv*D]
        picked = every.gather(1, ids.unsqueeze(-1).expand(-1, -1, every.shape[-1]))
        return picked, weights.to(hidden.dtype), ids  # [T, K, Hkv*D]

    def reduce(self, out: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
        """out [T, K, Hkv*D] -> sum_k weight_k * output_linear[id_k] @ out_k + bias [T, hidden],
        every expert's projection run (a token's top-k ids are distinct)."""
        experts = self.output_linear.weight.shape[0]
        picked = ids.unsqueeze(-1) == torch.arange(experts, device=ids.device)  # [T, K, E]
        gates = picked.to(out.dtype) * weights.unsqueeze(-1)
        per_expert = (gates.unsqueeze(-1) * out.unsqueeze(2)).sum(1)  # [T, E, Hkv*D]
        # a GEMM per expert over every token (a batched one over T would be data-dependent)
        return self.output_sum(sum(F.linear(per_expert[:, e], self.output_linear.weight[e])
                                   for e in range(experts))) + self.bias


class JetMoeAttention(nn.Module):
    """MoA self-attention: kv_proj (k, then v, Hkv heads of kv_channels), the experts' queries
    as K * Hkv heads; query head (kv head i, slot j) attends KV head i (transformers repeats
    the KV heads per slot: the same pairing, heads ordered slot-major there)."""

    def __init__(self, cfg: JetMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.top_k = layer_idx, cfg.moe.num_experts_per_tok
        self.num_kv_heads, self.head_dim = cfg.num_key_value_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.experts = JetMoeMoA(cfg)
        self.kv_proj = nn.Linear(cfg.hidden_size, 2 * self.num_kv_heads * self.head_dim,
                                 bias=False)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        queries, weights, ids = self.experts.map(hidden)
        shape = (-1, self.top_k, self.num_kv_heads, self.head_dim)
        q = queries.view(shape).transpose(1, 2).flatten(1, 2)  # [T, Hkv*K, D], KV-major
        k, v = (t.view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
                for t in self.kv_proj(hidden).chunk(2, -1))
        q, k = apply_rotary(q, k, rope)
        out = attention(q, k, v, self.layer_idx, self.scale, -1)  # [T, Hkv*K, D]
        out = out.view(-1, self.num_kv_heads, self.top_k, self.head_dim).transpose(1, 2)
        return self.experts.reduce(out.flatten(2), weights, ids)  # [T, K, Hkv*D] in

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """This rank's KV heads (and the K query heads a token reads each with): their rows
        of kv_proj (k's, then v's) and of every expert's query projection, their columns of
        every output projection, whose sum is all-reduced before the bias."""
        first, count = sharder.split(self.num_kv_heads, "num_key_value_heads")
        dim, moa = self.head_dim, self.experts
        start, size, full = first * dim, count * dim, self.num_kv_heads * dim
        sharder.fused_column(f"{prefix}.kv_proj", self.kv_proj, [(0, start, size),
                                                                 (full, start, size)])
        experts, _, hidden = moa.input_linear.weight.shape
        sharder.keep(f"{prefix}.experts.input_linear", moa.input_linear, "weight",
                     (experts, size, hidden), dim=1, start=start, size=size)
        sharder.keep(f"{prefix}.experts.output_linear", moa.output_linear, "weight",
                     (experts, hidden, size), dim=2, start=start, size=size)
        sharder.reduce(moa.output_sum)
        self.num_kv_heads = count


class JetMoeMoE(SparseMoeBlock):
    """The MLP experts: softmax over the top-k router logits, SiLU-gated experts, a bias."""

    def __init__(self, cfg: JetMoeConfig) -> None:
        super().__init__(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]."""
        return super().forward(hidden) + self.bias

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """The sharder's MoE block (all-reduced), its bias held by one rank."""
        sharder.moe(prefix, self)
        sharder.add_once(prefix, "bias")


class JetMoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer over MoA and the MoE MLP, its two norms at eps 1e-6 (as transformers
    builds them, whatever rms_norm_eps says)."""

    def __init__(self, cfg: JetMoeConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)  # not Llama's: its attention and MLP would be built to drop
        self.self_attn = JetMoeAttention(cfg, layer_idx)
        self.mlp = JetMoeMoE(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, LAYER_NORM_EPS)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, LAYER_NORM_EPS)


class JetMoeModel(LlamaModel):
    """The Llama body over JetMoE layers (the final norm at rms_norm_eps)."""

    layer_cls = JetMoeDecoderLayer


class JetMoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """JetMoE for causal LM: the Llama contract over JetMoeModel, checkpoint names mapped
    (self_attention -> self_attn, the stacked MLP experts and router onto the fused MoE's).
    Tensor parallelism splits the KV heads (each rank every attention expert's share of them)
    and the MLP experts' rows; LoRA is refused for MoE models."""

    model_cls = JetMoeModel
    config_cls = JetMoeConfig
    stacked_expert_tensors = True  # [E, 2I, H] and [E, H, I] checkpoint tensors: w13 / w2's
    renamed_modules = {".self_attention.": ".self_attn.",
                       ".mlp.input_linear.weight": ".mlp.experts.w13_weight",
                       ".mlp.output_linear.weight": ".mlp.experts.w2_weight",
                       ".mlp.router.layer.": ".mlp.gate."}
    # transformers' JetMoeConfig defaults (config.json may leave any of them out)
    hf_defaults = {"num_key_value_heads": 16, "kv_channels": 128, "intermediate_size": 5632,
                   "activation_function": "silu", "num_local_experts": 8,
                   "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                   "max_position_embeddings": 4096}
    # transformers' JetMoE: no window, no biases on its projections, its own expert keys
    hf_unread = WINDOW_KEYS + tuple(key for key in MOE_KEYS if key not in (
        "num_local_experts", "num_experts_per_tok")) + (
        "attention_bias", "qkv_bias", "o_proj_bias", "mlp_bias", "hidden_act",
        "num_attention_heads")

    @staticmethod
    def check_tensor_parallel(config: JetMoeConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size unless it divides num_key_value_heads (a
        token's K query heads per KV head stay on its rank)."""
        if config.num_key_value_heads % world:
            raise ValueError(f"tensor_parallel_size {world} must divide num_key_value_heads "
                             f"{config.num_key_value_heads}")
