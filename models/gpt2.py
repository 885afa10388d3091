"""GPT-2 decoder (GPT2LMHeadModel: gpt2, gpt2-medium/large/xl, distilgpt2): learned absolute
positions (wpe), pre-norm LayerNorms (ln_1, ln_2, ln_f), q/k/v as one c_attn, c_fc -> gelu_new
-> c_proj, a tied LM head. Its checkpoints store each projection as a Conv1D ([in, out]):
weight_name maps those tensors onto our nn.Linear weights transposed. Attention is the one
opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.config import HIDDEN_ACTS, DecoderConfig
from compiled_llm.models.fused_heads import shard_stacked_qkv, transpose_weights
from compiled_llm.models.layers import CausalLM, DenseMLP, LMHead

CONV1D_WEIGHTS = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
# buffers older checkpoints saved: the causal mask and its fill value
IGNORED_WEIGHTS = (".attn.bias", ".attn.masked_bias")


@dataclasses.dataclass
class GPT2Config(DecoderConfig):
    """DecoderConfig read from GPT-2's spelling (n_embd, n_layer, n_head, n_positions, n_inner,
    activation_function), plus its attention scaling and LayerNorm eps."""

    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GPT2Config:
        """The keys transformers' GPT2Config reads (its attribute_map's long names as well);
        cross-attention is refused by name."""
        def get(key: str, alias: str | None = None) -> Any:
            if key not in hf_config and alias in hf_config:
                return hf_config[alias]
            return hf_config.get(key, defaults.get(key))

        arch = (hf_config.get("architectures") or ["GPT2LMHeadModel"])[0]
        if hf_config.get("add_cross_attention"):
            raise ValueError(f"add_cross_attention=True is not supported for {arch} "
                             "(decoder-only generation: no encoder states to attend to)")
        act = get("activation_function")
        if act not in HIDDEN_ACTS:
            raise ValueError(f"activation_function {act!r} is not supported for {arch}; "
                             f"have {list(HIDDEN_ACTS)}")
        hidden, heads = get("n_embd", "hidden_size"), get("n_head", "num_attention_heads")
        base = DecoderConfig.from_hf({
            "vocab_size": hf_config["vocab_size"], "hidden_size": hidden,
            "intermediate_size": get("n_inner") or 4 * hidden,
            "num_hidden_layers": get("n_layer", "num_hidden_layers"),
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads,
            "max_position_embeddings": get("n_positions", "max_position_embeddings"),
            "tie_word_embeddings": get("tie_word_embeddings"), "hidden_act": act,
            "attention_bias": True, "o_proj_bias": True, "mlp_bias": True,
            "architectures": hf_config.get("architectures")})
        return cls(**vars(base), layer_norm_epsilon=get("layer_norm_epsilon"),
                   scale_attn_weights=bool(get("scale_attn_weights")),
                   scale_attn_by_inverse_layer_idx=bool(get("scale_attn_by_inverse_layer_idx")))


class Conv1DWeight(NamedTuple):
    """A Conv1D checkpoint weight [in, out]: it fills nn.Linear `name`'s [out, in] transposed."""

    name: str

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The view of param the checkpoint tensor is copied into (its transpose)."""
        return param.t()


class GPT2Attention(nn.Module):
    """Multi-head self-attention (no GQA, no RoPE): q/k/v the three thirds of c_attn."""

    def __init__(self, cfg: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5 if cfg.scale_attn_weights else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            self.scale /= float(layer_idx + 1)
        self.embed_dim = cfg.hidden_size
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.c_attn(hidden).split(self.embed_dim, -1)  # [T, hidden] each
        q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(-1, self.num_heads, self.head_dim)
        v = v.view(-1, self.num_heads, self.head_dim)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)  # [T, H, D]
        return self.c_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism (called by the block's): this rank's heads' rows of each third
        of c_attn, c_proj by columns."""
        shard_stacked_qkv(sharder, prefix, self, "c_attn", "c_proj")
        self.embed_dim = self.num_heads * self.head_dim  # this rank's q width


class GPT2Block(nn.Module):
    """ln_1, attention, residual add; ln_2, MLP, residual add."""

    attention_cls = GPT2Attention
    conv1d_weights = True  # the checkpoint's linears are Conv1D ([in, out])

    def __init__(self, cfg: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.attn = self.attention_cls(cfg, layer_idx)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("c_fc", "c_proj"))  # c_proj(act(c_fc(x)))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.attn(self.ln_1(hidden))
        return hidden + self.mlp(self.ln_2(hidden))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism: the attention by heads (its own hook), mlp.c_fc by rows and
        mlp.c_proj by columns; Conv1D weights read in the checkpoint's transposed coordinates."""
        self.attn.shard_for_tp(sharder, f"{prefix}.attn")
        sharder.ungated_mlp(f"{prefix}.mlp", self.mlp)
        if self.conv1d_weights:  # GPT-2's own checkpoints (not GPT-Neo's, GPTBigCode's)
            transpose_weights(sharder, [f"{prefix}.{name}" for name in (
                "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")])


class GPT2Model(nn.Module):
    """Token (wte) and learned position (wpe) embeddings, the blocks (h), the final ln_f."""

    block_cls = GPT2Block

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.h = nn.ModuleList(self.block_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.wte(input_ids) + self.wpe(positions)  # [T, hidden]
        for block in self.h:
            hidden = block(hidden)
        return self.ln_f(hidden)


class GPT2LMHeadModel(CausalLM):
    """GPT-2 for causal LM: forward(input_ids [T], positions [T]) -> hidden [T, hidden]; the LM
    head is tied to wte unless tie_word_embeddings is false; tensor parallelism by heads.
    Pipeline parallelism and LoRA adapters are refused by name (the layers are not the Llama
    family's)."""

    config_cls = GPT2Config
    body_cls = GPT2Model
    body_name = "transformer"
    embed_name = "transformer.wte"  # split by vocab rows under tensor parallelism
    # transformers' GPT2Config defaults (config.json may leave any of them out); its
    # reorder_and_upcast_attn only upcasts the eager path's scores to float32, as the attention
    # op computes them anyway, so it changes nothing here
    hf_defaults = {"n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
                   "n_inner": None, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
                   "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True}
    hf_unread: tuple[str, ...] = ()  # GPT2Config.from_hf reads GPT-2's own keys alone

    def __init__(self, cfg: GPT2Config, max_len: int | None = None) -> None:
        super().__init__()
        self.config = cfg  # max_len: positions are bounded by wpe, not by it
        self.transformer = self.body_cls(cfg)
        self.lm_head = LMHead(cfg, self.transformer.wte)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | Conv1DWeight | None:
        """Our parameter name for a checkpoint tensor name (None: a saved mask buffer). Names
        of a GPT2Model checkpoint (h.*, wte.*, as gpt2 ships) gain transformers'
        base_model_prefix `transformer.`; Conv1D weights load transposed."""
        if hf_name.endswith(IGNORED_WEIGHTS):
            return None
        if not hf_name.startswith(("transformer.", "lm_head.")):
            hf_name = f"transformer.{hf_name}"
        return Conv1DWeight(hf_name) if hf_name.endswith(CONV1D_WEIGHTS) else hf_name
