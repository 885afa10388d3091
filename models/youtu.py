"""Youtu decoder (YoutuForCausalLM: tencent/Youtu-LLM-2B): the Llama layer loop with DeepSeek-V3's
multi-head latent attention (models/mla.py, expanded: q latent or q_proj, RoPE on interleaved
pairs where rope_interleave) and a dense gated MLP in every layer."""

from __future__ import annotations

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.glm4_moe import ROUTER_KEYS
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from compiled_llm.models.mla import MlaAttention, MlaConfig, MlaModel


class YoutuDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (gated MLP, RMSNorms) with MLA."""

    attention_cls = MlaAttention


class YoutuModel(MlaModel):
    """The Llama body over Youtu layers; its rotary table spans qk_rope_head_dim alone."""

    layer_cls = YoutuDecoderLayer


class YoutuForCausalLM(LlamaForCausalLM):
    """Youtu for causal LM: the Llama contract over YoutuModel (pipeline parallelism as
    Llama's; tensor parallelism splits MLA by heads, MlaAttention.shard_for_tp). LoRA is
    refused by the q/k/v_proj it lacks."""

    model_cls = YoutuModel
    config_cls = MlaConfig
    # transformers' YoutuConfig defaults (config.json may leave any of them out)
    hf_defaults = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
                   "attention_bias": False, "rope_interleave": True,
                   "max_position_embeddings": 131072, "tie_word_embeddings": True}
    # transformers' Youtu reads no window, expert or router keys (DeepSeek-V3's, removed from
    # its config), biases q_a / kv_a / o_proj per attention_bias, never the MLP
    hf_unread = WINDOW_KEYS + MOE_KEYS + ROUTER_KEYS + (
        "qkv_bias", "o_proj_bias", "mlp_bias", "topk_method", "use_qk_norm")
