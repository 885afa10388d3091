"""OPT decoder (OPTForCausalLM: facebook/opt-125m ... opt-66b, and opt-350m's layout): learned
absolute positions (OPT's table starts 2 rows in), LayerNorms before each block
(do_layer_norm_before) or after its residual add (opt-350m), biased q/k/v/out_proj,
fc1 -> activation_function -> fc2, and word embeddings narrower than the layers
(word_embed_proj_dim, through project_in / project_out). Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import HIDDEN_ACTS, DecoderConfig
from compiled_llm.models.fused_heads import shard_split_attention
from compiled_llm.models.layers import ACTIVATIONS, CausalLM, LMHead

POSITION_OFFSET = 2  # OPT's learned table keeps two rows before position 0 (fairseq's padding)


@dataclasses.dataclass
class OPTConfig(DecoderConfig):
    """DecoderConfig plus OPT's keys, read from config.json's OPT spelling (ffn_dim,
    activation_function, enable_bias)."""

    word_embed_proj_dim: int = 0
    do_layer_norm_before: bool = True
    final_layer_norm: bool = True  # the decoder's norm after the last layer
    layer_norm_elementwise_affine: bool = True

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> OPTConfig:
        """The keys transformers' OPTConfig has, defaults where config.json leaves one out."""
        def get(key: str) -> Any:
            return hf_config.get(key, defaults.get(key))

        act, bias = get("activation_function"), bool(get("enable_bias"))
        if act not in HIDDEN_ACTS:
            raise ValueError(f"activation_function {act!r} is not supported for OPT; "
                             f"have {list(HIDDEN_ACTS)}")
        heads, hidden = hf_config["num_attention_heads"], hf_config["hidden_size"]
        base = DecoderConfig.from_hf({
            "vocab_size": hf_config["vocab_size"], "hidden_size": hidden,
            "intermediate_size": get("ffn_dim"), "num_hidden_layers": get("num_hidden_layers"),
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "max_position_embeddings": get("max_position_embeddings"),
            "tie_word_embeddings": get("tie_word_embeddings"), "hidden_act": act,
            "attention_bias": bias, "o_proj_bias": bias, "mlp_bias": bias,
            "architectures": hf_config.get("architectures")})
        pre_norm = bool(get("do_layer_norm_before"))
        return cls(**vars(base), word_embed_proj_dim=get("word_embed_proj_dim") or hidden,
                   do_layer_norm_before=pre_norm,
                   final_layer_norm=pre_norm and not get("_remove_final_layer_norm"),
                   layer_norm_elementwise_affine=bool(get("layer_norm_elementwise_affine")))


def layer_norm(cfg: OPTConfig) -> nn.LayerNorm:
    """OPT's LayerNorm over hidden_size (torch's eps, as transformers' OPT)."""
    return nn.LayerNorm(cfg.hidden_size, elementwise_affine=cfg.layer_norm_elementwise_affine)


class OPTAttention(nn.Module):
    """Multi-head self-attention (no GQA, no RoPE) over q/k/v_proj and out_proj."""

    def __init__(self, cfg: OPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, hidden, bias=bias)
        self.v_proj = nn.Linear(hidden, hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        v = self.v_proj(hidden).view(-1, self.num_heads, self.head_dim)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.out_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]


class OPTDecoderLayer(nn.Module):
    """Attention then fc1 -> act -> fc2, each with a residual add; the norms before each
    block (do_layer_norm_before) or after its residual add."""

    def __init__(self, cfg: OPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.pre_norm = cfg.do_layer_norm_before
        self.self_attn = OPTAttention(cfg, layer_idx)
        self.self_attn_layer_norm = layer_norm(cfg)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.activation_fn = ACTIVATIONS[cfg.hidden_act]
        self.final_layer_norm = layer_norm(cfg)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        if self.pre_norm:
            hidden = hidden + self.self_attn(self.self_attn_layer_norm(hidden))
            mlp_in = self.final_layer_norm(hidden)
            return hidden + self.fc2(self.activation_fn(self.fc1(mlp_in)))
        hidden = self.self_attn_layer_norm(hidden + self.self_attn(hidden))
        return self.final_layer_norm(hidden + self.fc2(self.activation_fn(self.fc1(hidden))))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: q/k/v_proj by this rank's heads' rows, out_proj by their
        columns; fc1 by rows, fc2 by columns (each output all-reduced, its bias added once)."""
        shard_split_attention(sharder, f"{prefix}.self_attn", self.self_attn, "out_proj")
        start, size = sharder.split(self.fc1.out_features, "ffn_dim")
        sharder.column(f"{prefix}.fc1", self.fc1, start, size)
        sharder.row(f"{prefix}.fc2", self.fc2, start, size)


class OPTDecoder(nn.Module):
    """Token and learned position embeddings, the layers, the final norm (pre-norm models)
    and the projections between word_embed_proj_dim and hidden_size where they differ."""

    def __init__(self, cfg: OPTConfig) -> None:
        super().__init__()
        hidden, word_dim = cfg.hidden_size, cfg.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(cfg.vocab_size, word_dim)
        self.embed_positions = nn.Embedding(cfg.max_position_embeddings + POSITION_OFFSET, hidden)
        projected = word_dim != hidden
        self.project_in = nn.Linear(word_dim, hidden, bias=False) if projected else None
        self.project_out = nn.Linear(hidden, word_dim, bias=False) if projected else None
        self.layers = nn.ModuleList(OPTDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_layer_norm = layer_norm(cfg) if cfg.final_layer_norm else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, word_embed_proj_dim]."""
        hidden = self.embed_tokens(input_ids)  # [T, word_embed_proj_dim]
        if self.project_in is not None:
            hidden = self.project_in(hidden)  # [T, hidden]
        hidden = hidden + self.embed_positions(positions + POSITION_OFFSET)
        for layer in self.layers:
            hidden = layer(hidden)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        return hidden if self.project_out is None else self.project_out(hidden)


class OPTModel(nn.Module):
    """transformers' OPTModel: the decoder under `decoder` (checkpoint names model.decoder.*)."""

    def __init__(self, cfg: OPTConfig) -> None:
        super().__init__()
        self.decoder = OPTDecoder(cfg)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, word_embed_proj_dim]."""
        return self.decoder(input_ids, positions)


class OPTForCausalLM(CausalLM):
    """OPT for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, D]; the LM head
    (tied to embed_tokens unless tie_word_embeddings is false) reads word_embed_proj_dim;
    tensor parallelism by heads. Pipeline parallelism and LoRA adapters are refused by name
    (the layers are not the Llama family's)."""

    config_cls = OPTConfig
    embed_name = "model.decoder.embed_tokens"  # split by vocab rows under tensor parallelism
    # transformers' OPTConfig defaults (config.json may leave any of them out)
    hf_defaults = {"ffn_dim": 3072, "num_hidden_layers": 12, "max_position_embeddings": 2048,
                   "do_layer_norm_before": True, "_remove_final_layer_norm": False,
                   "word_embed_proj_dim": None, "activation_function": "relu",
                   "enable_bias": True, "layer_norm_elementwise_affine": True,
                   "tie_word_embeddings": True}
    hf_unread: tuple[str, ...] = ()  # OPTConfig.from_hf reads OPT's own keys alone

    def __init__(self, cfg: OPTConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg  # max_len: positions are bounded by the learned table, not by it
        self.model = OPTModel(cfg)
        head_cfg = dataclasses.replace(cfg, hidden_size=cfg.word_embed_proj_dim)
        self.lm_head = LMHead(head_cfg, self.model.decoder.embed_tokens)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name: a checkpoint of OPTModel (names
        decoder.*, as facebook/opt-* ship) gains transformers' base_model_prefix `model.`."""
        if hf_name.startswith(("model.", "lm_head.")):
            return hf_name
        return f"model.{hf_name}"
