"""GPT-Neo decoder (GPTNeoForCausalLM: EleutherAI gpt-neo-125m/1.3B/2.7B): GPT-2's body (learned
positions wpe, pre-norm LayerNorms, c_fc -> gelu_new -> c_proj, a tied head) over nn.Linear
weights, bias-free q/k/v_proj and a biased out_proj, scores NOT scaled by 1/sqrt(head_dim),
and attention_types naming each layer global or local (a sliding window of window_size keys,
the query's own included). Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import HIDDEN_ACTS, DecoderConfig
from compiled_llm.models.fused_heads import shard_split_attention
from compiled_llm.models.gpt2 import GPT2Block, GPT2Config, GPT2LMHeadModel, GPT2Model

# the causal masks older checkpoints saved under attn.attention (bias, masked_bias)
IGNORED_WEIGHTS = (".attn.attention.bias", ".attn.attention.masked_bias")
LAYER_KINDS = ("global", "local")


def expand_attention_types(attention_types: Any, num_layers: int) -> list[str]:
    """transformers' expansion of attention_types ([[kinds, repeat], ...]) into one kind a
    layer; ValueError naming the field unless it gives num_layers of 'global' / 'local'."""
    try:
        layers = [kind for kinds, repeat in attention_types for _ in range(repeat)
                  for kind in kinds]
    except (TypeError, ValueError):
        raise ValueError(f"attention_types {attention_types!r} is not a list of "
                         "[[kinds...], repeat] pairs") from None
    unknown = sorted({str(kind) for kind in layers} - set(LAYER_KINDS))
    if unknown:
        raise ValueError(f"attention_types {unknown} are not supported for GPTNeoForCausalLM; "
                         f"have {list(LAYER_KINDS)}")
    if len(layers) != num_layers:
        raise ValueError(f"attention_types give {len(layers)} layers, num_layers is {num_layers}")
    return layers


@dataclasses.dataclass
class GPTNeoConfig(GPT2Config):
    """GPT-2's fields read from GPT-Neo's spelling (hidden_size, num_layers, num_heads,
    intermediate_size, activation_function, layer_norm_epsilon), local layers as the windowed
    ones (sliding_window = window_size)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GPTNeoConfig:
        """The keys transformers' GPTNeoConfig reads (its attribute_map's long names too)."""
        def get(key: str, alias: str | None = None) -> Any:
            if key not in hf_config and alias in hf_config:
                return hf_config[alias]
            return hf_config.get(key, defaults.get(key))

        hidden, heads = get("hidden_size"), get("num_heads", "num_attention_heads")
        num_layers = get("num_layers", "num_hidden_layers")
        kinds = expand_attention_types(get("attention_types"), num_layers)
        window = get("window_size")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window_size {window!r} is not supported for GPTNeoForCausalLM: "
                             "give a positive number of keys")
        act = get("activation_function")
        if act not in HIDDEN_ACTS:
            raise ValueError(f"activation_function {act!r} is not supported for "
                             f"GPTNeoForCausalLM; have {list(HIDDEN_ACTS)}")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_heads {heads}")
        base = DecoderConfig.from_hf({
            "vocab_size": hf_config["vocab_size"], "hidden_size": hidden,
            "intermediate_size": get("intermediate_size") or 4 * hidden,
            "num_hidden_layers": num_layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "head_dim": hidden // heads,
            "max_position_embeddings": get("max_position_embeddings"),
            "tie_word_embeddings": get("tie_word_embeddings"),
            "hidden_act": act, "mlp_bias": True, "o_proj_bias": True,
            "sliding_window": window, "architectures": hf_config.get("architectures"),
            "layer_types": ["sliding_attention" if kind == "local" else "full_attention"
                            for kind in kinds]})
        return cls(**vars(base), layer_norm_epsilon=get("layer_norm_epsilon"),
                   scale_attn_weights=False)


class GPTNeoAttention(nn.Module):
    """Multi-head attention, scale 1.0 (transformers' GPT-Neo never divides by sqrt(head_dim)),
    a window of window_size keys on local layers."""

    def __init__(self, cfg: GPTNeoConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.sliding_window = cfg.layer_window(layer_idx)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(self, name, nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False))
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(hidden).view(-1, self.num_heads, self.head_dim)
        v = self.v_proj(hidden).view(-1, self.num_heads, self.head_dim)
        attn_out = attention(q, k, v, self.layer_idx, 1.0, self.sliding_window)  # [T, H, D]
        return self.out_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism (called by the block's): q/k/v_proj by this rank's heads' rows,
        out_proj by their columns."""
        shard_split_attention(sharder, prefix, self, "out_proj")


class GPTNeoBlock(GPT2Block):
    """GPT-2's block (ln_1, attention, ln_2, c_fc / c_proj MLP) around GPTNeoAttention."""

    attention_cls = GPTNeoAttention
    conv1d_weights = False  # nn.Linear weights


class GPTNeoModel(GPT2Model):
    """wte + wpe, GPT-Neo blocks (h), ln_f."""

    block_cls = GPTNeoBlock


class GPTNeoForCausalLM(GPT2LMHeadModel):
    """GPT-Neo for causal LM: GPT-2's contract (a bias-free head tied to wte unless
    tie_word_embeddings is false), tensor parallelism by heads; pipeline parallelism and LoRA
    refused by name as GPT-2's. Checkpoint names attn.attention.* load as attn.* (so q/k/v sit
    under `attn`, where the load-time q/k/v fusion looks)."""

    config_cls = GPTNeoConfig
    body_cls = GPTNeoModel
    # transformers' GPTNeoConfig defaults (config.json may leave any of them out)
    hf_defaults = {"max_position_embeddings": 2048, "hidden_size": 2048, "num_layers": 24,
                   "num_heads": 16, "intermediate_size": None, "window_size": 256,
                   "attention_types": [[["global", "local"], 12]],
                   "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                   "tie_word_embeddings": True}

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name (None: a saved mask buffer); a
        GPTNeoModel checkpoint's names gain the `transformer.` prefix."""
        if hf_name.endswith(IGNORED_WEIGHTS):
            return None
        if not hf_name.startswith(("transformer.", "lm_head.")):
            hf_name = f"transformer.{hf_name}"
        return hf_name.replace(".attn.attention.", ".attn.")
