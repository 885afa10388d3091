"""Llama 4 text decoder (Llama4ForCausalLM; Llama4ForConditionalGeneration's text stack through
models/multimodal.py): MoE layers (sigmoid top-k router whose score scales each expert's input,
plus a shared expert) interleaved with dense ones, RoPE on interleaved pairs then weightless
q/k norms on RoPE layers, NoPE layers with a per-position query temperature. Chunked attention
is served within one chunk: max_model_len <= attention_chunk_size (config_fields caps it)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, DecoderConfig, MoeConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.moe import FusedMoE
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary_interleaved

LAYER_TYPES = ("full_attention", "chunked_attention")


@dataclasses.dataclass
class Llama4Config(DecoderConfig):
    """DecoderConfig (intermediate_size: the dense layers' intermediate_size_mlp; moe: the
    experts, the shared expert as wide, dense layers outside moe_layers) plus Llama 4's
    attention settings; attention_chunk_size is None where no layer is chunked."""

    rope_layers: tuple[int, ...] = ()  # the others are NoPE
    use_qk_norm: bool = True
    attn_temperature_tuning: bool = True
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    attention_chunk_size: int | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Llama4Config:
        """transformers' Llama4TextConfig rules for the layer lists; ValueError naming a field
        (layer_types, attention_chunk_size, no_rope_layers, quantization_config) it cannot
        follow."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        if hf_config.get("quantization_config"):
            raise ValueError("quantization_config: quantized Llama 4 checkpoints are not "
                             "supported yet")
        layers = hf_config["num_hidden_layers"]
        flags = get("no_rope_layers") or [int((i + 1) % get("no_rope_layer_interval") != 0)
                                          for i in range(layers)]
        if len(flags) < layers:
            raise ValueError(f"no_rope_layers: {len(flags)} entries for {layers} layers")
        step = get("interleave_moe_layer_step")
        moe_layers = get("moe_layers")
        moe_layers = range(step - 1, layers, step) if moe_layers is None else moe_layers
        chunk = get("attention_chunk_size")
        types = get("layer_types") or ["chunked_attention" if flag and chunk is not None
                                       else "full_attention" for flag in flags]
        if len(types) < layers or not set(types) <= set(LAYER_TYPES):
            raise ValueError(f"layer_types {types!r} is not supported; give one of "
                             f"{LAYER_TYPES} per layer")
        chunked = "chunked_attention" in types[:layers]
        if chunked and not (isinstance(chunk, int) and chunk > 0):
            raise ValueError(f"attention_chunk_size {chunk!r}: chunked_attention layers need "
                             "a positive chunk size")
        inter = get("intermediate_size")
        hf = {**hf_config, "intermediate_size": get("intermediate_size_mlp"),
              "moe_intermediate_size": inter}
        base = super().from_hf(hf, **defaults)
        moe = MoeConfig(num_experts=get("num_local_experts"),
                        num_experts_per_tok=get("num_experts_per_tok"),
                        moe_intermediate_size=inter, shared_expert_intermediate_size=inter,
                        mlp_only_layers=tuple(i for i in range(layers) if i not in moe_layers))
        return dataclasses.replace(
            base, moe=moe, rope_layers=tuple(i for i in range(layers) if flags[i]),
            use_qk_norm=bool(get("use_qk_norm")),
            attn_temperature_tuning=bool(get("attn_temperature_tuning")),
            floor_scale=float(get("floor_scale")), attn_scale=float(get("attn_scale")),
            attention_chunk_size=chunk if chunked else None)


class Llama4RotaryEmbedding(RotaryEmbedding):
    """RotaryEmbedding whose step output also carries the NoPE layers' query temperature."""

    def __init__(self, cfg: Llama4Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.floor_scale, self.attn_scale = cfg.floor_scale, cfg.attn_scale

    def forward(self, positions: torch.Tensor):
        """(cos, sin) [T, 1, D] and 1 + attn_scale * log1p(floor((pos + 1) / floor_scale))
        [T, 1, 1] (float32, as transformers)."""
        cos, sin = super().forward(positions)
        blocks = torch.floor((positions.float() + 1.0) / self.floor_scale)  # [T]
        return cos, sin, (torch.log1p(blocks) * self.attn_scale + 1.0)[:, None, None]


def l2_norm(heads: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMSNorm over each head's dims, in float32 (transformers' L2Norm)."""
    x = heads.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(heads.dtype)


class Llama4TextAttention(LlamaAttention):
    """LlamaAttention (o_proj biased as q/k/v) with RoPE on interleaved pairs and q/k norms
    after it on RoPE layers; NoPE layers scale q by the temperature where it is tuned."""

    def __init__(self, cfg: Llama4Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_rope = layer_idx in cfg.rope_layers
        self.norm_eps = cfg.rms_norm_eps if cfg.use_qk_norm and self.use_rope else None
        self.tuned = cfg.attn_temperature_tuning and not self.use_rope

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope):
        """RoPE in float32 (then q/k norms), or NoPE's q times its token's temperature."""
        cos, sin, temperature = rope
        if self.use_rope:
            q_rot, k_rot = apply_rotary_interleaved(q.float(), k.float(), (cos, sin))
            q, k = q_rot.to(q.dtype), k_rot.to(k.dtype)
            if self.norm_eps is not None:
                q, k = l2_norm(q, self.norm_eps), l2_norm(k, self.norm_eps)
            return q, k
        return ((q * temperature).to(q.dtype) if self.tuned else q), k


class Llama4TextMoe(nn.Module):
    """router -> top-k logits, sigmoid scores that scale the token fed to each chosen expert
    (the experts' outputs summed unweighted), plus the shared expert."""

    def __init__(self, cfg: Llama4Config) -> None:
        super().__init__()
        moe = cfg.moe
        self.top_k, self.hidden_size = moe.num_experts_per_tok, cfg.hidden_size
        self.router = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = FusedMoE(moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size)
        self.shared_expert = GatedMLP(cfg.hidden_size, moe.shared_expert_intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]: each (token, slot) one row of the expert op, weight 1."""
        top, ids = self.router(hidden).topk(self.top_k, dim=-1)  # [T, K]
        scores = torch.sigmoid(top.float()).to(hidden.dtype)
        routed_in = (hidden.unsqueeze(1) * scores.unsqueeze(-1)).flatten(0, 1)  # [T*K, H]
        flat_ids = ids.reshape(-1, 1)  # [T*K, 1]
        ones = torch.ones(flat_ids.shape, dtype=torch.float32, device=hidden.device)
        routed = self.experts(routed_in, ones, flat_ids)  # [T*K, H]
        routed = routed.view(-1, self.top_k, self.hidden_size).sum(1)  # [T, H]
        return self.shared_expert(hidden) + routed

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: the shared and routed experts split by intermediate rows (the
        stacked gate_up_proj [E, H, 2I]'s gate and up columns, down_proj [E, I, H]'s rows), the
        sum all-reduced; under expert parallelism, whole experts."""
        experts, at = self.experts, f"{prefix}.experts"
        sharder.mlp(f"{prefix}.shared_expert", self.shared_expert, reduce=False)
        sharder.reduce(self)
        if sharder.expert_parallel:
            return sharder.whole_experts(at, experts)
        full, (num, _, hidden) = experts.intermediate_size, experts.w13_weight.shape
        start, size = sharder.split(full, "intermediate_size")
        sharder.keep_parts(at, experts, "w13_weight", (num, 2 * size, hidden), dim=2,
                           parts=[(start, size), (full + start, size)])
        sharder.keep(at, experts, "w2_weight", (num, hidden, size), dim=1, start=start, size=size)
        experts.intermediate_size = size


class Llama4TextDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer (its forward) whose MLP, under transformers' name feed_forward,
    is Llama4TextMoe on the config's MoE layers, else a GatedMLP of intermediate_size_mlp."""

    def __init__(self, cfg: Llama4Config, layer_idx: int) -> None:
        nn.Module.__init__(self)  # the MLP is built here, not by Llama's moe_or_dense_mlp
        self.self_attn = Llama4TextAttention(cfg, layer_idx)
        self.feed_forward = (Llama4TextMoe(cfg) if cfg.moe.is_sparse(layer_idx)
                             else GatedMLP(cfg.hidden_size, cfg.intermediate_size))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def mlp(self) -> nn.Module:
        """feed_forward, under the name Llama's forward calls."""
        return self.feed_forward


class Llama4TextModel(LlamaModel):
    """The Llama body over Llama 4 layers; its rotary table adds the query temperature."""

    layer_cls = Llama4TextDecoderLayer

    def __init__(self, cfg: Llama4Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.rotary_emb = Llama4RotaryEmbedding(cfg, max_len)


class TransposedExperts(NamedTuple):
    """Stacked experts (gate_up_proj [E, H, 2I], down_proj [E, I, H]) as w13 / w2, transposed."""

    name: str

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The whole parameter."""
        return param

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor in our layout."""
        return tensor.transpose(1, 2)


class Llama4ForCausalLM(LlamaForCausalLM):
    """Llama 4 text for causal LM (tensor and expert parallelism: its MoE blocks shard
    themselves). LoRA is refused (MoE); a model longer than attention_chunk_size is refused
    where chunked layers are."""

    model_cls = Llama4TextModel
    config_cls = Llama4Config
    # stacked experts are [E, in, out] whatever the shapes (a text stack takes them from here)
    stacked_experts_transposed = True
    # transformers' Llama4TextConfig defaults (config.json may leave any of them out)
    hf_defaults = {"intermediate_size": 8192, "intermediate_size_mlp": 16384, "head_dim": 128,
                   "num_local_experts": 16, "num_experts_per_tok": 1,
                   "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
                   "use_qk_norm": True, "attention_chunk_size": 8192,
                   "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                   "max_position_embeddings": 131072, "attention_bias": False}
    # keys transformers' Llama 4 never reads: no window, experts named num_local_experts,
    # o_proj biased as q/k/v, unbiased MLPs
    hf_unread = ("sliding_window", "use_sliding_window", "max_window_layers") + tuple(
        key for key in MOE_KEYS if key not in ("num_local_experts", "num_experts_per_tok")) + (
        "qkv_bias", "o_proj_bias", "mlp_bias")

    def __init__(self, cfg: Llama4Config, max_len: int | None = None) -> None:
        chunk = cfg.attention_chunk_size
        if chunk is not None and max_len is not None and max_len > chunk:
            raise ValueError(f"max_model_len {max_len} exceeds attention_chunk_size {chunk}: "
                             "chunked attention is served within one chunk")
        if chunk is not None:
            max_len = min(max_len or cfg.max_position_embeddings, chunk)
        super().__init__(cfg, max_len)

    def weight_name(self, hf_name: str):
        """Our parameter for a checkpoint tensor; the stacked experts transposed into ours."""
        prefix, _, proj = hf_name.rpartition(".experts.")
        if prefix and proj in ("gate_up_proj", "down_proj"):
            ours = "w13_weight" if proj == "gate_up_proj" else "w2_weight"
            return TransposedExperts(f"{prefix}.experts.{ours}")
        return super().weight_name(hf_name)
