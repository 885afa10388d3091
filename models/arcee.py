"""Arcee decoder (ArceeForCausalLM: arcee-ai/AFM-4.5B): the Llama layout with an ungated MLP,
down_proj(relu2(up_proj(x))) (hidden_act, relu2 by default; biased where mlp_bias says)."""

from __future__ import annotations

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import DenseMLP
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class ArceeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with the ungated up_proj / down_proj MLP."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("up_proj", "down_proj"), bias=cfg.mlp_bias)


class ArceeModel(LlamaModel):
    """The Llama body over Arcee layers."""

    layer_cls = ArceeDecoderLayer


class ArceeForCausalLM(LlamaForCausalLM):
    """Arcee for causal LM: the Llama contract over ArceeModel (pipeline parallelism as
    Llama's; tensor parallelism as Llama's, its up_proj split by rows). LoRA is refused
    by the gate_proj it lacks."""

    model_cls = ArceeModel
    # transformers' ArceeConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "relu2", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                   "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    # transformers' Arcee never reads these: no window, no experts, o_proj biased as q/k/v
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
