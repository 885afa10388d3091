"""DecoderConfig: the fields a decoder-only model reads from an HF config.json.

One dataclass for the whole family; each model file adjusts defaults through `from_hf`.
MoeConfig holds the mixture-of-experts fields (None on a dense model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compiled_llm.config_fields import hf_rope_dict

# rope types with a table of their own in models/rotary.py (transformers' ROPE_INIT_FUNCTIONS)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")
_NEEDS_FACTOR = ("linear", "dynamic", "llama3", "yarn")  # HF's rope types that require it
_NEEDS_ORIGINAL = ("llama3", "yarn", "longrope")  # ... and original_max_position_embeddings
# the gate activations GatedMLP has (layers.ACTIVATIONS; transformers' ACT2FN names)
HIDDEN_ACTS = ("silu", "swish", "gelu", "gelu_python", "gelu_new", "gelu_fast",
               "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate", "gelu_10", "quick_gelu",
               "relu", "relu2", "relu6", "leaky_relu", "sigmoid", "tanh", "mish", "linear")
# config.json keys of a sliding window, and of mixture-of-experts layers: an architecture whose
# transformers class never reads them lists them in its hf_unread (the loader drops them)
WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
            "norm_topk_prob", "shared_expert_intermediate_size", "decoder_sparse_step",
            "mlp_only_layers")


def rope_params(hf_config: dict[str, Any], get=None) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict) as transformers 5 standardizes them: a legacy rope_scaling
    replaces rope_parameters; rope_theta from inside, else top-level, else the architecture's
    default (`get`); a top-level original_max_position_embeddings wins (Phi-3's rule)."""
    get = get or hf_config.get
    params = hf_rope_dict(hf_config)
    nested = sorted(key for key, value in params.items() if isinstance(value, dict))
    if nested:  # transformers 5's per-layer-type spelling (Gemma 3's), which these models lack
        raise ValueError(f"rope_parameters per layer type ({', '.join(nested)}) is not "
                         "supported; give one rope_parameters dict for every layer")
    theta = params.pop("rope_theta", None)
    theta = get("rope_theta", 10000.0) if theta is None else theta
    kind = params["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported; have {ROPE_TYPES}")
    if "partial_rotary_factor" not in params and "partial_rotary_factor" in hf_config:
        params["partial_rotary_factor"] = hf_config["partial_rotary_factor"]
    max_positions = get("max_position_embeddings", 2048)
    if kind in _NEEDS_ORIGINAL:
        params.setdefault("original_max_position_embeddings", max_positions)
    if kind in _NEEDS_FACTOR:
        params["factor"] = _rope_factor(params, max_positions)
    if kind == "longrope":
        _check_longrope(params, max_positions)
    return float(theta), params


def _rope_factor(scaling: dict[str, Any], max_positions: int) -> float:
    """The scaling factor, as HF reads it: required; an explicit null only for YaRN, where it
    is max_position_embeddings / original_max_position_embeddings (HF's DeepSeek-V3 rule)."""
    kind = scaling["rope_type"]
    if "factor" not in scaling:
        raise ValueError(f"rope_scaling.factor is required for rope_type {kind!r}")
    factor = scaling["factor"]
    if factor is None and kind == "yarn":
        return max_positions / scaling["original_max_position_embeddings"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ValueError(f"rope_scaling.factor must be a number for rope_type {kind!r}, "
                         f"got {factor!r}")
    return float(factor)


def _check_longrope(scaling: dict[str, Any], max_positions: int) -> None:
    """LongRoPE's short_factor and long_factor are required lists of numbers; its factor (for
    the attention factor) defaults to max_position_embeddings / the original length."""
    for key in ("short_factor", "long_factor"):
        value = scaling.get(key)
        if not isinstance(value, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            raise ValueError(f"rope_scaling.{key} must be a list of numbers for rope_type "
                             f"'longrope', got {value!r}")
    if scaling.get("factor") is None:
        scaling["factor"] = max_positions / scaling["original_max_position_embeddings"]


def _check_rotary_dim(scaling: dict[str, Any], head_dim: int) -> None:
    """transformers rotates every dim for the default rope (partial_rotary_factor unread) and
    zero-pads proportional's; the other types make a shorter table its attention cannot use.
    LongRoPE's factors: one per rotated pair of dims."""
    factor = scaling.get("partial_rotary_factor")
    kind = scaling["rope_type"]
    for key in ("short_factor", "long_factor") if kind == "longrope" else ():
        if len(scaling[key]) not in (1, head_dim // 2):  # one per rotated pair (HF broadcasts)
            raise ValueError(f"rope_scaling.{key} must have head_dim / 2 = {head_dim // 2} "
                             f"entries, got {len(scaling[key])}")
    if factor is None or kind in ("default", "proportional"):
        return
    if int(head_dim * factor) != head_dim:
        raise ValueError(f"partial_rotary_factor {factor!r} is not supported with rope_type "
                         f"{kind!r}: every one of the head_dim {head_dim} dims is rotated")


def _check_hidden_act(act: Any, moe: bool) -> None:
    if act not in HIDDEN_ACTS:
        raise ValueError(f"hidden_act {act!r} is not supported; have {list(HIDDEN_ACTS)}")
    if moe and act not in ("silu", "swish"):  # compiled_llm::fused_moe is SiLU-gated
        raise ValueError(f"hidden_act {act!r} is not supported with mixture-of-experts layers; "
                         "have ['silu']")


@dataclass
class MoeConfig:
    """Routed experts of a mixture-of-experts decoder (Qwen2/Qwen3-MoE, Mixtral spellings)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # per expert
    norm_topk_prob: bool = False  # renormalise the top-k weights to sum to 1
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    decoder_sparse_step: int = 1  # every step-th layer is sparse ...
    mlp_only_layers: tuple[int, ...] = ()  # ... except these, which stay dense

    @classmethod
    def from_hf(cls, get) -> MoeConfig | None:
        """Read through `get(key, fallback)`; None when the config names no experts."""
        experts = get("num_experts") or get("num_local_experts") or 0
        if not experts:
            return None
        return cls(
            num_experts=experts,
            num_experts_per_tok=get("num_experts_per_tok"),
            moe_intermediate_size=get("moe_intermediate_size") or get("intermediate_size"),
            norm_topk_prob=bool(get("norm_topk_prob", False)),
            shared_expert_intermediate_size=get("shared_expert_intermediate_size", 0) or 0,
            decoder_sparse_step=get("decoder_sparse_step", 1) or 1,
            mlp_only_layers=tuple(get("mlp_only_layers") or ()),
        )

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether layer layer_idx routes to experts (HF's rule) rather than a dense MLP."""
        return (layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)


@dataclass
class DecoderConfig:
    """Shapes and constants of a Llama-family decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on q/k/v_proj
    o_proj_bias: bool = False
    mlp_bias: bool = False  # biases on a dense MLP's gate/up/down_proj (Llama's mlp_bias)
    hidden_act: str = "silu"  # the gate's activation (HIDDEN_ACTS)
    sliding_window: int = -1  # -1: full attention
    sliding_window_layers: tuple[int, ...] | None = None  # the windowed layers; None: all
    architecture: str = ""
    moe: MoeConfig | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """Read an HF config dict; `defaults` fill keys the architecture leaves out."""
        def get(key: str, fallback: Any = None) -> Any:
            return hf_config.get(key, defaults.get(key, fallback))

        heads = hf_config["num_attention_heads"]
        head_dim = get("head_dim") or hf_config["hidden_size"] // heads
        theta, scaling = rope_params(hf_config, get)
        cls.check_rotary(scaling, head_dim)
        moe = MoeConfig.from_hf(get)
        act = get("hidden_act", "silu")
        _check_hidden_act(act, moe is not None)
        window = get("sliding_window") if get("use_sliding_window", True) else None
        # Qwen2-MoE spells it qkv_bias; o_proj follows attention_bias unless the model says
        bias = get("attention_bias", get("qkv_bias", False))
        return cls(
            vocab_size=hf_config["vocab_size"],
            hidden_size=hf_config["hidden_size"],
            intermediate_size=hf_config["intermediate_size"],
            num_hidden_layers=hf_config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=get("max_position_embeddings", 2048),
            tie_word_embeddings=get("tie_word_embeddings", False),
            attention_bias=bias,
            o_proj_bias=get("o_proj_bias", bias),
            mlp_bias=get("mlp_bias", False),
            hidden_act=act,
            sliding_window=window or -1,
            sliding_window_layers=cls.sliding_layers(hf_config, get),
            architecture=(hf_config.get("architectures") or [""])[0],
            moe=moe,
        )

    @staticmethod
    def check_rotary(scaling: dict[str, Any], head_dim: int) -> None:
        """ValueError for a rotary setting the model's table cannot apply (every dim turns)."""
        _check_rotary_dim(scaling, head_dim)

    @staticmethod
    def sliding_layers(hf_config: dict[str, Any], get) -> tuple[int, ...] | None:
        """The layers a sliding window applies to (None: every layer), as HF decides: the
        layers layer_types marks sliding_attention, else (older Qwen2/Qwen3 configs) those from
        max_window_layers on. A model whose HF config reads these differently overrides it."""
        layer_types = hf_config.get("layer_types")
        if layer_types:
            return tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
        max_window_layers = get("max_window_layers")
        if max_window_layers is not None:
            return tuple(range(max_window_layers, hf_config["num_hidden_layers"]))
        return None

    def layer_window(self, layer_idx: int) -> int:
        """The sliding window of layer layer_idx (-1: full attention)."""
        layers = self.sliding_window_layers
        return self.sliding_window if layers is None or layer_idx in layers else -1
