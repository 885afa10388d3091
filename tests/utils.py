"""Test helpers: tiny random HF checkpoints (with a real byte-level BPE tokenizer) on disk."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import torch

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Permission is hereby granted, free of charge, "
    "to any person obtaining a copy of this software. Ünïcödé — 日本語のテキスト, emoji 🚀🙂! "
    "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED. "
) * 20

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1)

CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "llama3_rope": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama_linear_rope": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "llama_dynamic_rope": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}),
    "mistral": ("MistralConfig", {"sliding_window": 24, "head_dim": 16}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": False}),
    # one qkv_proj and one gate_up_proj, a window on every layer
    "phi3": ("Phi3Config", {"sliding_window": 24, "pad_token_id": None}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
    # Granite's four scalars, each away from 1, on a tied head
    "granite": ("GraniteConfig", {"embedding_multiplier": 12.0, "attention_multiplier": 0.2,
                                  "residual_multiplier": 0.22, "logits_scaling": 8.0,
                                  "tie_word_embeddings": True}),
    # norms after each block, q/k normed over the whole projection
    "olmo2": ("Olmo2Config", {"pad_token_id": None}),
    # OLMo 1: non-parametric LayerNorms, q/k/v clamped (low enough to bite), a tied head
    "olmo": ("OlmoConfig", {"clip_qkv": 0.5, "tie_word_embeddings": True, "pad_token_id": None}),
    # OLMo 3: a sliding layer (its own default RoPE base), then a full one (linear RoPE)
    "olmo3": ("Olmo3Config", {
        "pad_token_id": None, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                            "full_attention": {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 1e6}}}),
    # OLMoE: q/k RMSNorms over the whole projection, q/k/v clamped, 4 experts top-2 in
    # every layer, renormalised
    "olmoe": ("OlmoeConfig", {"pad_token_id": None, "clip_qkv": 0.5, "num_experts": 4,
                              "num_experts_per_tok": 2, "intermediate_size": 32,
                              "norm_topk_prob": True}),
    # FlexOlmo: OLMo 2's post-norm layer (biased q/k/v/o here) with 4 experts top-2, renormalised
    "flex_olmo": ("FlexOlmoConfig", {"pad_token_id": None, "num_experts": 4,
                                     "num_experts_per_tok": 2, "intermediate_size": 32,
                                     "norm_topk_prob": True, "attention_bias": True}),
    # DBRX: one Wqkv clamped low enough to bite, bias-free LayerNorms, 4 experts top-2 whose
    # weights are divided by their 2-norm; transformers 5 reads rope_parameters' base, not
    # attn_config's
    "dbrx": ("DbrxConfig", {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 512,
                            "attn_config": {"kv_n_heads": 2, "clip_qkv": 0.5,
                                            "rope_theta": 1e4},
                            "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4,
                                           "moe_top_k": 2, "moe_normalize_expert_weights": 2.0},
                            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
    # PhiMoE: biased LayerNorms, q/k/v/o and LM head, a window on every layer, sparsemixer over
    # 4 experts (its jitter_eps high enough to keep a few logits), LongRoPE within its original
    # length (short factors, cos and sin scaled by short_mscale)
    "phimoe": ("PhimoeConfig", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
        "attention_bias": True, "lm_head_bias": True, "sliding_window": 24,
        "router_jitter_noise": 0.3, "max_position_embeddings": 1024, "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 512,
            "short_factor": [1.0 + 0.2 * i for i in range(8)],
            "long_factor": [2.0 + 0.5 * i for i in range(8)],
            "short_mscale": 1.2, "long_mscale": 1.2}}),
    # HunYuan MoE: per-head q/k norms after RoPE, biased q/k/v/o, 4 experts top-2 (a per-layer
    # moe_topk list) and the ungated shared MLP, the NTK alpha rope
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", {
        "head_dim": 16, "attention_bias": True, "num_experts": 4, "moe_topk": [2, 2],
        "intermediate_size": 32, "pad_token_id": None,
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 1000.0,
                            "factor": 1.0}}),
    # MiniMax-M2: q/k RMSNorms over the whole projection, RoPE on half of each head (the
    # released checkpoints' rotary_dim), sigmoid top-2 of 4 experts (a correction bias added by
    # test_moe_more_archs)
    "minimax_m2": ("MiniMaxM2Config", {
        "head_dim": 16, "rotary_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 32, "rope_parameters": {
            # partial_rotary_factor as rotary_dim says: transformers 5.17 reads only the factor
            "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}),
    # GPT-OSS: sink logits, a window of 8 on its even layers, YaRN (transformers' default),
    # 4 experts top-2 with biases and the clamped SwiGLU (test_gpt_oss.py randomises biases)
    "gpt_oss": ("GptOssConfig", {"head_dim": 16, "num_local_experts": 4,
                                 "num_experts_per_tok": 2, "intermediate_size": 32,
                                 "sliding_window": 8, "pad_token_id": None}),
    # GPT-NeoX: one query_key_value ([H, 3, D] rows), half of each head turned, attention
    # and MLP in parallel; then serial, with unbiased attention, a quarter turned, a tied head
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5}),
    "gpt_neox_serial": ("GPTNeoXConfig", {"use_parallel_residual": False,
                                          "attention_bias": False, "tie_word_embeddings": True}),
    # Phi (phi-2 with phi-1.5's per-head q/k LayerNorms): half of each head turned, GQA
    "phi": ("PhiConfig", {"qk_layernorm": True, "pad_token_id": None}),
    # learned absolute positions (OPT's offset of 2), pre-norm LayerNorms, fc1 -> relu -> fc2
    "opt": ("OPTConfig", {"ffn_dim": 128, "init_std": 0.1}),
    # learned positions (wpe), Conv1D weights stored [in, out], q/k/v as one c_attn
    "gpt2": ("GPT2Config", {}),
    # StarCoder2: LayerNorms, biased q/k/v/o and c_fc / c_proj, a window on every layer
    "starcoder2": ("Starcoder2Config", {"sliding_window": 24}),
    # StableLM 2 12B's options: per-head q/k LayerNorms, attention and MLP in parallel, biased
    # q/k/v, half of each head turned; then StableLM 2 1.6B's: serial, a quarter turned
    "stablelm": ("StableLmConfig", {"qk_layernorm": True, "use_parallel_residual": True,
                                    "use_qkv_bias": True, "partial_rotary_factor": 0.5}),
    "stablelm_serial": ("StableLmConfig", {"use_qkv_bias": True}),
    # GPTBigCode: multi-query (one KV head) c_attn, nn.Linear weights; then multi-head
    "gpt_bigcode": ("GPTBigCodeConfig", {}),
    "gpt_bigcode_mha": ("GPTBigCodeConfig", {"multi_query": False}),
    # a NoPE layer every second one (no_rope_layer_interval 2), a window on the first
    "smollm3": ("SmolLM3Config", {"no_rope_layer_interval": 2, "pad_token_id": None,
                                  "use_sliding_window": True, "sliding_window": 8,
                                  "layer_types": ["sliding_attention", "full_attention"]}),
    # a sliding layer (its own RoPE base), then a full one (linear RoPE), a query scale apart
    # from head_dim and soft-capped logits
    "gemma3": ("Gemma3TextConfig", {
        "head_dim": 16, "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8, "query_pre_attn_scalar": 24, "final_logit_softcapping": 30.0,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                            "full_attention": {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 1e6}}}),
    # Gemma 1: the legacy hidden_act "gelu" (read as the tanh approximation), biased q/k/v/o
    "gemma": ("GemmaConfig", {"head_dim": 16, "hidden_act": "gelu", "attention_bias": True}),
    # Gemma 2: sliding then full layers, soft-capped attention scores and logits (caps low
    # enough to bite at these weights), a query scale apart from head_dim
    "gemma2": ("Gemma2Config", {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0}),
    # biased o_proj (attention_bias) and MLP (mlp_bias); YaRN past its original length
    "llama_biases": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "qwen3_yarn_bias": ("Qwen3Config", {"head_dim": 32, "attention_bias": True, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 32}}),
    # the window on layers from max_window_layers on only (config.json's layer_types)
    "qwen2_window_layers": ("Qwen2Config", {
        "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    # mixture of experts: 8 experts, top-2; dense and sparse layers mixed where the config can
    "qwen3_moe": ("Qwen3MoeConfig", {
        "head_dim": 32, "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1]}),
    "mixtral": ("MixtralConfig", {
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48}),
    "qwen2_moe": ("Qwen2MoeConfig", {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2}),
    # Cohere: parallel attention and MLP off one bias-free LayerNorm, interleaved RoPE,
    # per-head q/k LayerNorms, logits times logit_scale, a tied head; then without q/k norms,
    # with biased attention and an untied head
    "cohere": ("CohereConfig", {"use_qk_norm": True, "logit_scale": 0.5, "pad_token_id": None}),
    "cohere_plain": ("CohereConfig", {"attention_bias": True, "tie_word_embeddings": False,
                                      "pad_token_id": None}),
    # Cohere 2: a sliding layer (interleaved RoPE), then a full one (no RoPE), biased q/k/v/o
    "cohere2": ("Cohere2Config", {"layer_types": ["sliding_attention", "full_attention"],
                                  "sliding_window": 8, "logit_scale": 0.5,
                                  "attention_bias": True, "pad_token_id": None}),
    # EXAONE 4.0: post-norms, per-head q/k norms, a sliding layer (RoPE), a full one (NoPE)
    "exaone4": ("Exaone4Config", {"layer_types": ["sliding_attention", "full_attention"],
                                  "sliding_window": 8, "head_dim": 32}),
    # HunYuan dense: per-head q/k norms after RoPE, biased q/k/v/o
    "hunyuan": ("HunYuanDenseV1Config", {"head_dim": 16, "attention_bias": True,
                                         "pad_token_id": None}),
    # GPT-J: interleaved RoPE on half of each head, parallel attention and MLP off ln_1
    "gptj": ("GPTJConfig", {"rotary_dim": 8}),
    # Bloom: ALiBi (16 heads: the slopes of a power of two; 12: the extra odd powers), the
    # residual after each LayerNorm or before it; head_dim 16 (the Triton kernels')
    "bloom": ("BloomConfig", {"num_attention_heads": 16, "hidden_size": 256}),
    "bloom_post_ln": ("BloomConfig", {"num_attention_heads": 12, "hidden_size": 192,
                                      "apply_residual_connection_post_layernorm": True}),
    # MPT: ALiBi over 6 heads (MPT's slopes of a padded head count), clamped Wqkv, its own
    # softmax scale
    "mpt": ("MptConfig", {"d_model": 96, "n_heads": 6, "n_layers": 2, "max_seq_len": 512,
                          "attn_config": {"clip_qkv": 0.6, "softmax_scale": 0.2}}),
    # Falcon-7B's layout: multi-query query_key_value, attention and MLP off one LayerNorm;
    # Falcon-40B's: [q..., k, v] per KV group, ln_attn / ln_mlp, biased; then serial, per head
    "falcon": ("FalconConfig", {"multi_query": True, "parallel_attn": True}),
    "falcon_new_arch": ("FalconConfig", {"new_decoder_architecture": True, "num_kv_heads": 2,
                                         "bias": True, "tie_word_embeddings": False}),
    "falcon_serial": ("FalconConfig", {"multi_query": False, "parallel_attn": False}),
    # Falcon-RW's: ALiBi for RoPE (6 heads: Bloom's extra slopes), serial, per-head layout
    "falcon_alibi": ("FalconConfig", {"alibi": True, "multi_query": False,
                                      "parallel_attn": False, "bias": True,
                                      "num_attention_heads": 6, "hidden_size": 96}),
    # GLM-4: interleaved RoPE on half of each head, biased q/k/v, one gate_up_proj; GLM-4-0414
    # norms each block's output too
    "glm": ("GlmConfig", {"head_dim": 16, "pad_token_id": None}),
    "glm4": ("Glm4Config", {"head_dim": 16, "pad_token_id": None}),
    # Granite's four scalars away from 1 with a sparse MoE block in every layer
    "granitemoe": ("GraniteMoeConfig", {
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48,
        "embedding_multiplier": 12.0, "attention_multiplier": 0.2, "residual_multiplier": 0.22,
        "logits_scaling": 8.0}),
    # GraniteMoe plus an ungated shared MLP beside the routed experts
    "granitemoeshared": ("GraniteMoeSharedConfig", {
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48,
        "shared_intermediate_size": 24, "embedding_multiplier": 12.0,
        "attention_multiplier": 0.2, "residual_multiplier": 0.22, "logits_scaling": 8.0}),
    # GLM-4.5: a dense first layer, then grouped sigmoid routing (2 groups, 1 kept), scaled
    # weights, two shared experts' width; half of each head turned, per-head q/k norms, biased
    # q/k/v (tests/models/test_shared_expert_archs.py adds a correction bias)
    "glm4_moe": ("Glm4MoeConfig", {
        "num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": 8,
        "n_shared_experts": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5, "use_qk_norm": True,
        "attention_bias": True, "pad_token_id": None}),
    # dots.llm1: Qwen3 attention biased on all four projections, a window of 8 from layer 1,
    # a dense first layer, 4 groups of experts (2 kept), unnormalised scaled weights
    "dots1": ("Dots1Config", {
        "num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": 8,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "n_group": 4, "topk_group": 2, "routed_scaling_factor": 1.5, "norm_topk_prob": False,
        "attention_bias": True, "sliding_window": 8, "max_window_layers": 1,
        "pad_token_id": None}),
    # ERNIE 4.5 MoE: use_bias everywhere (the LM head too), a dense first layer, softmax top-2
    # of 8 experts chosen with a correction bias (added by test_shared_expert_archs), one
    # shared expert
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", {
        "num_hidden_layers": 3, "use_bias": True, "moe_num_experts": 8, "moe_k": 2,
        "moe_intermediate_size": 32, "moe_num_shared_experts": 1, "moe_layer_start_index": 1,
        "pad_token_id": None}),
    # Ministral: a window of 8 on the first layer alone (layer_types), full attention after
    "ministral": ("MinistralConfig", {"sliding_window": 8, "head_dim": 16, "pad_token_id": None,
                                      "layer_types": ["sliding_attention", "full_attention"]}),
    # Seed-OSS: biased q/k/v (its default) and o_proj (attention_out_bias), head_dim 32 (not
    # hidden / heads)
    "seed_oss": ("SeedOssConfig", {"head_dim": 32, "attention_out_bias": True,
                                   "pad_token_id": None}),
    # Helium: RoPE on interleaved pairs, float32-scaled norms
    "helium": ("HeliumConfig", {"head_dim": 16, "pad_token_id": None}),
    # Arcee: the ungated up_proj -> relu2 -> down_proj MLP
    "arcee": ("ArceeConfig", {}),
    # ERNIE 4.5: interleaved RoPE in float32, use_bias on every projection, a tied head
    "ernie4_5": ("Ernie4_5Config", {"head_dim": 16, "use_bias": True, "pad_token_id": None}),
    # Nemotron: (1 + weight) LayerNorms, half of each head turned, biased q/k/v/o and relu2 MLP
    "nemotron": ("NemotronConfig", {"attention_bias": True, "mlp_bias": True,
                                    "pad_token_id": None}),
    # Persimmon: one [H, 3, D] query_key_value, per-head q/k LayerNorms, half of each head
    # turned, biased relu2 MLP (SMALL's num_key_value_heads is a key it never reads)
    "persimmon": ("PersimmonConfig", {"pad_token_id": None}),
    # VaultGemma: Gemma 2's (sliding then full layers, low caps, a query scale apart from
    # head_dim) with two norms a layer; biased q/k/v/o
    "vaultgemma": ("VaultGemmaConfig", {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0, "attention_bias": True}),
    # Apertus: xIELU MLP (its scalars checkpoint tensors), per-head q/k norms, its default
    # llama3 RoPE, biased q/k/v/o
    "apertus": ("ApertusConfig", {"attention_bias": True, "pad_token_id": None}),
    # Ministral 3: YaRN past an original length of 32, queries scaled by Llama 4's
    # 1 + beta * log(1 + floor(position / 32)) after RoPE, a window of 24 on every layer
    "ministral3": ("Ministral3Config", {
        "head_dim": 16, "sliding_window": 24, "pad_token_id": None,
        "max_position_embeddings": 128, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5}}),
    # CWM: a window of 8 on layer 1 (layer_types as transformers derives them: every fourth
    # layer full from the first), its default llama3 RoPE, a biased MLP
    "cwm": ("CwmConfig", {"head_dim": 16, "sliding_window": 8, "mlp_bias": True,
                          "pad_token_id": None, "bos_token_id": 1}),  # its bos must be an int
    # Jais 2: LayerNorms, biased q/k/v/o and relu2 MLP (its defaults)
    "jais2": ("Jais2Config", {"pad_token_id": None}),
    # DeepSeek-V2-Lite's shape: MLA without a q latent (q_proj), q/k heads of 16 + 8 rope dims
    # and v heads of 16 (padded to 32), biased latent projections, a dense first layer, then
    # softmax top-2 of 4 experts within the best of 2 groups, scaled, one shared expert
    "deepseek_v2": ("DeepseekV2Config", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "topk_method": "group_limited_greedy", "routed_scaling_factor": 2.0,
        "attention_bias": True, "pad_token_id": None}),
    # DeepSeek-V3's shape: a q latent, YaRN (mscale and mscale_all_dim: the softmax scale
    # too), grouped sigmoid routing with a correction bias (randomised by the tests),
    # renormalised and scaled
    "deepseek_v3": ("DeepseekV3Config", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 24,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "pad_token_id": None,
        "max_position_embeddings": 128, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32, "mscale": 0.8, "mscale_all_dim": 1.0,
            "beta_fast": 32, "beta_slow": 1}}),
    # GLM-4.7-Flash's shape: DeepSeek-V3's MLA (q latent, interleaved RoPE, YaRN with
    # mscale_all_dim) biased, v heads of 20 (padded to 32), dense layers where mlp_layer_types
    # says (the middle one), 2 groups of 4 experts (1 kept), renormalised and scaled
    "glm4_moe_lite": ("Glm4MoeLiteConfig", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 24,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 20,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2,
        "moe_intermediate_size": 32, "mlp_layer_types": ["sparse", "dense", "sparse"],
        "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.8, "attention_bias": True,
        "pad_token_id": None, "max_position_embeddings": 128, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32, "mscale": 0.8, "mscale_all_dim": 1.0}}),
    # K-EXAONE: EXAONE 4.0's attention (q/k norms; a window of 8 with RoPE on the first of
    # every 2 layers, NoPE on the second) in pre-norm layers, two dense layers (
    # first_k_dense_replace) then grouped sigmoid routing (2 groups, 1 kept), two shared experts
    "exaone_moe": ("ExaoneMoeConfig", {
        "num_hidden_layers": 4, "head_dim": 32, "sliding_window": 8,
        "sliding_window_pattern": 2, "first_k_dense_replace": 2, "num_experts": 8,
        "num_experts_per_tok": 2, "num_shared_experts": 2, "moe_intermediate_size": 32,
        "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5, "pad_token_id": None}),
    # MiniCPM3: MLA with a q latent and rotate-half RoPE (LongRoPE within its original length
    # of 256, factor 2), scaled embeddings, residual branches and logits, biases, untied head
    "minicpm3": ("MiniCPM3Config", {
        "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24, "scale_emb": 3.0,
        "scale_depth": 1.6, "dim_model_base": 16, "attention_bias": True, "mlp_bias": True,
        "tie_word_embeddings": False, "pad_token_id": None, "rope_parameters": {
            # factor stated (its default is max / original): transformers 5.17 needs it
            "rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0,
            "original_max_position_embeddings": 256,
            "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [2.0, 3.0, 4.0, 6.0]}}),
}
# not part of the transformers comparison sweep: a deeper model for compile tests
EXTRA_CONFIGS = {
    # EXAONE 4.0 without a window: every layer full, with RoPE; HunYuan's NTK alpha rope
    "exaone4_global": ("Exaone4Config", {"layer_types": ["full_attention"] * 2,
                                         "sliding_window": None, "tie_word_embeddings": True}),
    "hunyuan_alpha": ("HunYuanDenseV1Config", {"head_dim": 16, "pad_token_id": None,
                                               "rope_parameters": {
                                                   "rope_type": "dynamic", "rope_theta": 1e4,
                                                   "alpha": 1000.0, "factor": 1.0}}),
    # a vocabulary two ranks cannot split evenly (Granite 3.x's 49155 is odd): untied, tied
    "llama_odd_vocab": ("LlamaConfig", {"vocab_size": 387}),
    "granite_odd_vocab": ("GraniteConfig", {**CONFIGS["granite"][1], "vocab_size": 387}),
    "qwen3_deep": ("Qwen3Config", {"head_dim": 32, "num_hidden_layers": 5}),
    # one KV head for four query heads: tensor parallelism replicates it
    "llama_kv1": ("LlamaConfig", {"num_key_value_heads": 1}),
    # a head_dim the Triton kernels do not take (CUDA's auto backend falls back to torch)
    "llama_hd24": ("LlamaConfig", {"head_dim": 24}),
    # an odd layer count: two pipeline stages split it unevenly
    "llama_3layers": ("LlamaConfig", {"num_hidden_layers": 3}),
    # Falcon's grouped query_key_value with attention and MLP off one input_layernorm
    "falcon_new_arch_one_ln": ("FalconConfig", {**CONFIGS["falcon_new_arch"][1],
                                                "num_ln_in_parallel_attn": 1}),
    # a window of 8 where layer_types (saved, or derived by HF) decides which layers slide
    "qwen2_moe_window": ("Qwen2MoeConfig", {
        **CONFIGS["qwen2_moe"][1], "num_hidden_layers": 4, "use_sliding_window": True,
        "sliding_window": 8, "max_window_layers": 3}),
    "qwen3_moe_window": ("Qwen3MoeConfig", {
        **CONFIGS["qwen3_moe"][1], "use_sliding_window": True, "sliding_window": 8,
        "max_window_layers": 1}),
    # config options (tests/models/test_config_options.py): LongRoPE past an original length of
    # 32 (factor 512 / 32), proportional RoPE on half the angles, non-SiLU gates
    "llama_longrope": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)]}}),
    # opt-350m's layout: norms after each residual add (no final norm), word embeddings of 32
    # projected in and out of the 64-wide layers
    "opt_350m_layout": ("OPTConfig", {"ffn_dim": 128, "init_std": 0.1,
                                      "do_layer_norm_before": False, "word_embed_proj_dim": 32}),
    # GPT-2's attention scale options (1 / layer_idx + 1 on top of 1/sqrt(head_dim)), its own
    # n_inner, an untied LM head
    "gpt2_options": ("GPT2Config", {"scale_attn_by_inverse_layer_idx": True, "n_inner": 96,
                                    "tie_word_embeddings": False}),
    # StarCoder2 with use_bias off, no window and an untied head
    "starcoder2_options": ("Starcoder2Config", {"use_bias": False, "sliding_window": None,
                                                "tie_word_embeddings": False}),
    # Gemma 3 1B's head_dim (256) and one KV head, sliding then full layers (GPU kernels)
    # Gemma 2 2B's head shape (head_dim 256, 2 query heads a KV head) with its caps
    "gemma2_d256": ("Gemma2Config", {
        "head_dim": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "sliding_window": 16, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "gemma3_d256": ("Gemma3TextConfig", {
        "head_dim": 256, "num_attention_heads": 4, "num_key_value_heads": 1,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16,
        "query_pre_attn_scalar": 256}),
    # Phi-4 mini's shape of config: LongRoPE, a tied head, 3/4 of each head turned
    "phi3_longrope_partial": ("Phi3Config", {
        "tie_word_embeddings": True, "pad_token_id": None, "original_max_position_embeddings": 32,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.75,
                            "short_factor": [1.0 + 0.1 * i for i in range(6)],
                            "long_factor": [2.0 + 0.5 * i for i in range(6)]}}),
    "llama_proportional_rope": ("LlamaConfig", {"partial_rotary_factor": 0.5, "rope_parameters": {
        "rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}}),
    "llama_gelu": ("LlamaConfig", {"hidden_act": "gelu", "mlp_bias": True}),
    "qwen3_gelu_tanh": ("Qwen3Config", {"head_dim": 32, "hidden_act": "gelu_pytorch_tanh"}),
    # keys the transformers class never reads, saved in config.json all the same
    "mistral_stray_keys": ("MistralConfig", {
        "sliding_window": 16, "head_dim": 16, "attention_bias": True, "mlp_bias": True,
        "max_window_layers": 1}),
    "qwen2_stray_keys": ("Qwen2Config", {"attention_bias": False, "mlp_bias": True}),
    "mixtral_stray_keys": ("MixtralConfig", {
        **CONFIGS["mixtral"][1], "norm_topk_prob": False, "attention_bias": True,
        "mlp_only_layers": [0]}),
    "qwen3_moe_stray_keys": ("Qwen3MoeConfig", {
        **CONFIGS["qwen3_moe"][1], "shared_expert_intermediate_size": 16, "mlp_bias": True}),
    # AFM-4.5B's YaRN RoPE (past an original length of 32) on Arcee's layout, biased, a tied
    # head; Helium biased where attention_bias and mlp_bias say
    "arcee_yarn": ("ArceeConfig", {
        "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 32}}),
    "helium_biased": ("HeliumConfig", {"head_dim": 16, "attention_bias": True, "mlp_bias": True,
                                       "pad_token_id": None}),
    # ERNIE 4.5 without biases (ERNIE-4.5-0.3B's use_bias) and with an untied head
    "ernie4_5_plain": ("Ernie4_5Config", {"head_dim": 16, "use_bias": False,
                                          "tie_word_embeddings": False, "pad_token_id": None}),
    # ERNIE 4.5 MoE without biases or a shared expert, a sparse layer every second one, untied
    "ernie4_5_moe_plain": ("Ernie4_5_MoeConfig", {
        **CONFIGS["ernie4_5_moe"][1], "num_hidden_layers": 3, "use_bias": False,
        "moe_num_shared_experts": 0, "moe_layer_start_index": 0, "moe_layer_interval": 2,
        "tie_word_embeddings": False}),
    # GPT-Neo: a global layer, then a local one (a window of 8), scores unscaled, a tied head
    "gpt_neo": ("GPTNeoConfig", {"attention_types": [[["global", "local"], 1]],
                                 "window_size": 8}),
    # CodeGen: qkv_proj in 4 blocks of (q, v, k), 2 heads a block; GPT-J's interleaved RoPE
    # on half of each head, parallel attention and MLP off ln_1, a biased untied head
    "codegen": ("CodeGenConfig", {"hidden_size": 128, "num_attention_heads": 8,
                                  "rotary_dim": 8, "n_inner": 256}),
    # NanoChat: weightless RMSNorms (one before the layers too), RoPE turned the other way,
    # q/k normed after it, biased q/k/v/o (attention_bias), GQA, relu2 fc1 / fc2, capped logits
    "nanochat": ("NanoChatConfig", {"attention_bias": True, "final_logit_softcapping": 2.0,
                                    "pad_token_id": None}),
    # Cohere 2 MoE: a dense first layer (48 wide, full attention with RoPE: force_rope), then
    # a sliding layer and a full one (no RoPE), softmax top-2 of 4 experts plus a shared
    # expert averaged in, bias-free LayerNorms, biased q/k/v/o; then sigmoid routing
    # renormalised, the shared expert summed, RMSNorms, three sparse layers
    "cohere2_moe": ("Cohere2MoeConfig", {
        "head_dim": 16, "num_hidden_layers": 3, "first_k_dense_replace": 1,
        "sliding_window": 8, "sliding_window_pattern": 2, "num_experts": 4,
        "num_experts_per_tok": 2, "num_shared_experts": 1, "intermediate_size": 32,
        "prefix_dense_intermediate_size": 48, "logit_scale": 0.5, "attention_bias": True,
        "pad_token_id": None}),
    "cohere2_moe_sigmoid": ("Cohere2MoeConfig", {
        "head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 2, "num_experts": 4,
        "num_experts_per_tok": 2, "num_shared_experts": 1, "intermediate_size": 32,
        "expert_selection_fn": "sigmoid", "norm_topk_prob": True,
        "shared_expert_combination_strategy": "sum", "rms_norm_eps": 1e-5,
        "pad_token_id": None}),
    # Solar Open: biased q/k/v (o_proj never), grouped sigmoid routing (2 groups, 1 kept) over
    # 8 experts with a correction bias (randomised by the test), scaled, a shared expert
    "solar_open": ("SolarOpenConfig", {
        "head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "attention_bias": True}),
    # Youtu: DeepSeek-V3's MLA (a q latent, q/k heads of 16 + 8 rope dims, v heads of 16,
    # interleaved RoPE, biased latent and o projections) in dense Llama layers, a tied head
    "youtu": ("YoutuConfig", {
        "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "attention_bias": True}),
    # Mellum: a sliding layer (a window of 8, its own default RoPE base) with a dense MLP,
    # then a full one (linear RoPE) over softmax top-2 of 4 experts; q/k norms, biased q/k/v/o
    "mellum": ("MellumConfig", {
        "head_dim": 16, "sliding_window": 8, "layer_types": ["sliding_attention",
                                                             "full_attention"],
        "mlp_layer_types": ["dense", "sparse"], "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "attention_bias": True, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}}),
    # (tests/models/test_granite_hy_archs.py) HyperCLOVA X: Granite's scalars away from 1
    # (logits multiplied), post_norm1 / 2 after each block, head_dim 32, biased q/k/v/o; then
    # without the post-norms, attention_multiplier left to its default, a tied head
    "hyperclovax": ("HyperCLOVAXConfig", {
        "head_dim": 32, "embedding_multiplier": 3.0, "attention_multiplier": 0.3,
        "residual_multiplier": 0.5, "logits_scaling": 0.7, "attention_bias": True,
        "pad_token_id": None}),
    "hyperclovax_plain": ("HyperCLOVAXConfig", {
        "use_post_norm": False, "residual_multiplier": 0.5, "tie_word_embeddings": True,
        "pad_token_id": None}),
    # Hy3: a sparse layer (sigmoid top-2 of 4 experts, a correction bias randomised by the
    # test, two experts' worth of shared MLP) then a dense one; q/k norms, biased q/k/v/o
    "hy_v3": ("HYV3Config", {
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 2,
        "moe_intermediate_size": 32, "router_scaling_factor": 2.5,
        "mlp_layer_types": ["sparse", "dense"], "attention_bias": True}),
    # Granite SWA: Granite's scalars, sinks (randomised by the test), sliding layers (a window
    # of 8) around a full one, RoPE bases 1e4 / none / 100 per layer
    "granite_swa": ("GraniteSWAConfig", {
        "num_hidden_layers": 3, "embedding_multiplier": 3.0, "attention_multiplier": 0.2,
        "residual_multiplier": 0.5, "logits_scaling": 2.0, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "layer_rope_theta": [1e4, 0, 100.0], "bos_token_id": None, "pad_token_id": None}),
}
# image-text-to-text checkpoints (served text-only): tiny vision towers beside a SMALL text
# model (text_config); M-RoPE sections tiling head_dim 16's rotated half
_MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3]}
_QWEN_VIT = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
             "out_hidden_size": 64}
_PATCHES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
EXTRA_CONFIGS.update({
    # Gemma 3 4B's shape of checkpoint: a SigLIP tower, sliding then full text layers
    "gemma3_vl": ("Gemma3Config", {
        "mm_tokens_per_image": 1, "vision_config": _PATCHES,
        "text_config": {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"],
                        "sliding_window": 16, "query_pre_attn_scalar": 16}}),
    "qwen2_vl": ("Qwen2VLConfig", {
        "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2},
        "text_config": {"rope_parameters": {**_MROPE, "rope_theta": 1e6}}}),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", {
        "vision_config": _QWEN_VIT, "text_config": {"rope_parameters": {**_MROPE,
                                                                        "rope_theta": 1e6}}}),
    # Qwen3-VL's interleaved M-RoPE; its MoE's experts stacked in two tensors a layer
    "qwen3_vl": ("Qwen3VLConfig", {
        "vision_config": {**_QWEN_VIT, "deepstack_visual_indexes": [0]},
        "text_config": {"head_dim": 16, "rope_parameters": {
            **_MROPE, "mrope_interleaved": True, "rope_theta": 5e5}}}),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", {
        "vision_config": {**_QWEN_VIT, "deepstack_visual_indexes": [0]},
        "text_config": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 16, "rope_parameters": {
                            **_MROPE, "mrope_interleaved": True, "rope_theta": 5e5}}}),
    "mistral3": ("Mistral3Config", {
        "vision_config": {**_PATCHES, "model_type": "pixtral", "head_dim": 16},
        "text_config": {"model_type": "mistral", "head_dim": 16, "sliding_window": None}}),
    # Llava over a Qwen2 text model (biased q/k/v)
    "llava": ("LlavaConfig", {
        "vision_config": {**_PATCHES, "model_type": "clip_vision_model", "projection_dim": 32},
        "text_config": {"model_type": "qwen2"}}),
})
# architectures whose own test files compare them with transformers on checkpoints with random
# norms and biases (a stronger check than the sweep's): out of the sweep, for CI time
EXTRA_CONFIGS.update({name: CONFIGS.pop(name) for name in (
    "flex_olmo", "dbrx", "phimoe", "hunyuan_v1_moe", "minimax_m2", "bloom", "bloom_post_ln",
    "mpt", "falcon_alibi", "nemotron", "persimmon", "vaultgemma", "apertus", "ministral3",
    "cwm", "jais2", "glm4_moe_lite", "exaone_moe", "minicpm3")})
# Gemma 4 (tests/models/test_gemma4.py): E2B's shape (sliding and wider full layers on
# proportional RoPE, PLE, the last two layers reading layers 0 and 1's caches with double-wide
# MLPs), and 26B-A4B's (full layers' keys as values on one KV head, a dense MLP beside experts)
_GEMMA4 = {"head_dim": 16, "global_head_dim": 32, "sliding_window": 8,
           "final_logit_softcapping": 30.0, "vocab_size_per_layer_input": 384,
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                               "full_attention": {"rope_type": "proportional",
                                                  "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1e6}}}
EXTRA_CONFIGS.update({
    "gemma4": ("Gemma4TextConfig", {
        **_GEMMA4, "num_hidden_layers": 4, "layer_types": ["sliding_attention",
                                                           "full_attention"] * 2,
        "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True}),
    "gemma4_moe": ("Gemma4TextConfig", {
        **_GEMMA4, "layer_types": ["sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 0, "attention_k_eq_v": True,
        "num_global_key_value_heads": 1, "enable_moe_block": True, "num_experts": 4,
        "top_k_experts": 2, "moe_intermediate_size": 32}),
})
# Gemma 4 E2B's shape of image-text-to-text checkpoint: the gemma4 text model beside a tower
EXTRA_CONFIGS["gemma4_vl"] = ("Gemma4Config", {
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16},
    "text_config": EXTRA_CONFIGS["gemma4"][1]})
# (GPU only) Gemma 4 31B's head sizes: sliding layers' 256, full layers' 512 (keys as values)
EXTRA_CONFIGS["gemma4_d512"] = ("Gemma4TextConfig", {
    **_GEMMA4, "head_dim": 256, "global_head_dim": 512, "num_attention_heads": 2,
    "num_key_value_heads": 1, "layer_types": ["sliding_attention", "full_attention"],
    "hidden_size_per_layer_input": 0, "attention_k_eq_v": True, "num_global_key_value_heads": 1})
# Gemma 3n (tests/models/test_gemma3n.py): E2B's shape at 4 layers: AltUp on 4 streams (the
# active one not the 0th), Laurel, PLE, the last two layers reading layers 0 and 1's caches,
# per-layer MLP widths, activation sparsity on three layers (one KV-shared)
EXTRA_CONFIGS["gemma3n"] = ("Gemma3nTextConfig", {
    "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2,
    "intermediate_size": [128, 96, 128, 64], "activation_sparsity_pattern": [0.95, 0.5, 0.0, 0.9],
    "altup_num_inputs": 4, "altup_active_idx": 1, "laurel_rank": 8,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 384,
    "final_logit_softcapping": 30.0})
# Gemma 3n's image-audio-text checkpoint (built with its timm vision tower stubbed): a 2-layer
# gemma3n text model whose ids from 256 are vision / audio ids (their own embedders) and miss
# the per-layer table, beside a 1-layer audio tower
EXTRA_CONFIGS["gemma3n_vl"] = ("Gemma3nConfig", {
    "vision_config": {"hidden_size": 32, "vocab_size": 64, "vocab_offset": 256},
    "audio_config": {"hidden_size": 32, "conf_num_hidden_layers": 1,
                     "conf_num_attention_heads": 2, "sscp_conv_channel_size": [8, 8],
                     "vocab_size": 64, "vocab_offset": 320},
    "text_config": {**EXTRA_CONFIGS["gemma3n"][1], "num_hidden_layers": 2,
                    "num_kv_shared_layers": 0,
                    "layer_types": ["sliding_attention", "full_attention"],
                    "intermediate_size": 128, "activation_sparsity_pattern": [0.95, 0.0],
                    "vocab_size_per_layer_input": 256}})
# Llama 4 (tests/models/test_llama4.py): a dense RoPE layer (llama3 rope on interleaved pairs,
# q/k norms, chunked within one chunk), then a NoPE MoE layer (a query temperature that bites
# within the prompts; 4 experts top-2 scaling their inputs, a shared expert); and its
# image-text-to-text checkpoint's shape (a tiny vision tower beside that text model)
_LLAMA4 = {"head_dim": 16, "intermediate_size": 48, "intermediate_size_mlp": 128,
           "num_local_experts": 4, "num_experts_per_tok": 2, "interleave_moe_layer_step": 2,
           "no_rope_layers": [1, 0], "attention_chunk_size": 512, "floor_scale": 4,
           "attn_scale": 0.5, "rope_parameters": {
               "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
EXTRA_CONFIGS["llama4"] = ("Llama4TextConfig", _LLAMA4)
EXTRA_CONFIGS["llama4_vl"] = ("Llama4Config", {
    "vision_config": {**_PATCHES, "vision_output_dim": 32, "projector_input_dim": 32,
                      "projector_output_dim": 32}, "text_config": _LLAMA4})
# AFMoE (Arcee Trinity; tests/models/test_afmoe.py): a dense first layer, then sigmoid-routed
# experts with a shared one; sliding layers with RoPE around a full NoPE one; gated attention
# output, biased q/k/v/o, muP's embedding scale
EXTRA_CONFIGS["afmoe"] = ("AfmoeConfig", {
    "num_hidden_layers": 3, "head_dim": 16, "sliding_window": 8, "num_dense_layers": 1,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
    "moe_intermediate_size": 32, "route_scale": 2.5, "mup_enabled": True,
    "attention_bias": True})
# MiMo-V2-Flash (tests/models/test_mimo_v2_flash.py): full layers around a sliding one (twice
# the KV heads, sinks, its own RoPE base and rotary share), 24-wide q/k and 16-wide v heads
# (a 32-wide cache), a dense first MLP, then experts in two groups under a float32 router
EXTRA_CONFIGS["mimo_v2_flash"] = ("MiMoV2FlashConfig", {
    "num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 24, "v_head_dim": 16,
    "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention",
                                         "full_attention"],
    "mlp_layer_types": ["dense", "sparse", "sparse"], "n_routed_experts": 8, "n_group": 2,
    "topk_group": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "routed_scaling_factor": 2.0, "attention_bias": True, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6,
                           "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                              "partial_rotary_factor": 0.5}}})
# DeepSeek Sparse Attention (tests/models/test_deepseek_v32.py), served within index_topk (96,
# under YaRN's 128 positions): DeepSeek-V3.2 as the deepseek_v3 case (q latent, YaRN with
# mscale_all_dim, a dense first layer, 2 groups of 4 experts); GLM-5 biased, 20-wide v heads,
# a dense middle layer, one group, its middle layer's indexer shared
_DSA = {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 24,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 2,
        "topk_group": 1, "routed_scaling_factor": 2.5, "pad_token_id": None,
        "max_position_embeddings": 128, "index_topk": 96, "index_head_dim": 16,
        "index_n_heads": 2, "rope_parameters": CONFIGS["deepseek_v3"][1]["rope_parameters"]}
EXTRA_CONFIGS["deepseek_v32"] = ("DeepseekV32Config", _DSA)
# LongCat-Flash (tests/models/test_longcat_flash.py): two decoder layers of two MLA
# attentions each (q latent, LoRA-rank scaling, YaRN with mscale_all_dim), 16-wide v heads
# (a 32-wide cache), a shortcut MoE of 4 experts and 2 zero experts, top-3, scaled
EXTRA_CONFIGS["longcat_flash"] = ("LongcatFlashConfig", {
    "num_layers": 2, "num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 24,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "head_dim": 8,
    "v_head_dim": 16, "n_routed_experts": 4, "zero_expert_num": 2, "moe_topk": 3,
    "expert_ffn_hidden_size": 32, "routed_scaling_factor": 1.5, "pad_token_id": None,
    "max_position_embeddings": 128,
    "rope_parameters": CONFIGS["deepseek_v3"][1]["rope_parameters"]})
EXTRA_CONFIGS["glm_moe_dsa"] = ("GlmMoeDsaConfig", {
    **_DSA, "v_head_dim": 20, "mlp_layer_types": ["sparse", "dense", "sparse"], "n_group": 1,
    "attention_bias": True, "indexer_types": ["full", "shared", "full"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
# tests/models/test_axk_bitnet.py: A.X-K1 as the deepseek_v3 case with 8 experts (its MoE
# layers' outputs normed); A.X-K2 as the deepseek_v32 case (grouped routing, gated norms of
# rank 8, q_b_proj making queries and output gates); BitNet: Llama's shape with sub-norms, relu2
_AXK = {key: value for key, value in _DSA.items()
        if key not in ("index_topk", "index_head_dim", "index_n_heads")}
EXTRA_CONFIGS.update({
    "axk1": ("AXK1Config", _AXK),
    "axk2": ("AXK2Config", {**_DSA, "gated_norm_rank": 8}),
    "bitnet": ("BitNetConfig", {}),
})

# Aria's text model (tests/models/test_aria_emu3.py): every layer 4 routed experts (top 2)
# beside 2 shared ones, hidden 64 = 2 * intermediate 32 (the stacked experts' [E, in, out]
# shape is square: only their layout tells the transposition); the options variant biases
# attention and the shared MLP under a GELU; Emu3's text model (bos / pad ids inside the
# vocabulary); and their image-text-to-text checkpoints (tiny towers beside those)
_ARIA = {"intermediate_size": 32, "moe_num_experts": 4, "moe_topk": 2,
         "moe_num_shared_experts": 2, "pad_token_id": 0}
_EMU3 = {"bos_token_id": 0, "pad_token_id": 0}
EXTRA_CONFIGS.update({
    "aria_text": ("AriaTextConfig", _ARIA),
    "aria_text_options": ("AriaTextConfig", {
        **_ARIA, "moe_num_shared_experts": 1, "attention_bias": True, "mlp_bias": True,
        "hidden_act": "gelu_pytorch_tanh", "rope_parameters": {"rope_type": "default",
                                                               "rope_theta": 5e5}}),
    "aria_vl": ("AriaConfig", {"vision_config": _PATCHES, "text_config": _ARIA,
                               "projector_patch_to_query_dict": {4: 4}}),
    "emu3": ("Emu3TextConfig", _EMU3),
    "emu3_vl": ("Emu3Config", {
        "text_config": _EMU3, "vq_config": {
            "codebook_size": 16, "embed_dim": 4, "latent_channels": 4, "base_channels": 32,
            "channel_multiplier": [1], "num_res_blocks": 1, "attn_resolutions": [],
            "temporal_downsample_factor": 1, "hidden_size": 16},
        "vocabulary_map": {"<image>": 380, "<|extra_200|>": 381,
                           "<|visual token 000000|>": 382, "<|visual token 000001|>": 383}}),
})
# tests/models/test_laguna_granite_hrm.py. Laguna: sliding layers (window 8, every dim turned)
# around a full one (half of each head turned, its own base), 2 query heads on the middle
# layer, softplus-gated heads, biased q/k/v/o, a dense first MLP, then sigmoid-routed experts
# (soft-capped logits, scaled) beside a shared one. GraniteMoeSWA: Granite SWA's attention over
# GraniteMoeShared's experts. HRM-Text: 2 layers a stack, run 2 x (1 + 1) times, biased
EXTRA_CONFIGS.update({
    "laguna": ("LagunaConfig", {
        "num_hidden_layers": 3, "head_dim": 16, "num_attention_heads_per_layer": [4, 2, 4],
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 8, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 24,
        "moe_routed_scaling_factor": 2.5, "moe_router_logit_softcapping": 4.0,
        "attention_bias": True}),
    "granitemoe_swa": ("GraniteMoeSWAConfig", {
        "num_hidden_layers": 3, "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 48, "shared_intermediate_size": 24,
        "embedding_multiplier": 3.0, "attention_multiplier": 0.2, "residual_multiplier": 0.5,
        "logits_scaling": 2.0, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "layer_rope_theta": [1e4, 0, 100.0], "bos_token_id": None, "pad_token_id": None}),
    "hrm_text": ("HrmTextConfig", {
        "head_dim": 16, "H_cycles": 2, "L_cycles": 1, "attention_bias": True,
        "mlp_bias": True}),
})

# (tests/models/test_diffllama_jetmoe_compass.py) DiffLlama: differential attention (two maps
# over the halves of 4 q / 2 KV heads), biased q/k/v/o; JetMoE: 4 attention experts (q and o
# projections, top-2 a token over 2 shared KV heads of 16) and 4 MLP experts, a final norm eps
# apart from the layers' fixed 1e-6; Cohere Compass' text stack: a sliding layer (default rope,
# M-RoPE sections) then a full one (linear rope, its own base), Cohere's parallel layer; its
# _linear variant (a linear-rope sliding layer, a NoPE full one) where transformers 5.17's
# permuted default-rope frequencies cannot differ (the GPU test's)
_COMPASS_TEXT = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
                 "logit_scale": 0.5, "attention_bias": True, "pad_token_id": None,
                 "rope_parameters": {
                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                           "mrope_section": [2, 3, 3]},
                     "full_attention": {"rope_type": "linear", "factor": 2.0,
                                        "rope_theta": 1e6, "mrope_section": [2, 3, 3]}}}
_COMPASS_VIT = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                "out_hidden_size": 64}
EXTRA_CONFIGS.update({
    "diffllama": ("DiffLlamaConfig", {"attention_bias": True}),
    # (tests/distributed/test_tp_more_archs.py) 4 KV heads: each map's 2 split over 2 ranks
    "diffllama_kv4": ("DiffLlamaConfig", {"attention_bias": True, "num_key_value_heads": 4}),
    "jetmoe": ("JetMoeConfig", {"kv_channels": 16, "num_local_experts": 4,
                                "num_experts_per_tok": 2, "intermediate_size": 32,
                                "rms_norm_eps": 1e-5}),
    "cohere_compass_text": ("CohereCompassTextConfig", _COMPASS_TEXT),
    "cohere_compass": ("CohereCompassConfig", {"vision_config": _COMPASS_VIT,
                                               "text_config": _COMPASS_TEXT}),
    "cohere_compass_linear": ("CohereCompassConfig", {
        "vision_config": _COMPASS_VIT, "text_config": {**_COMPASS_TEXT, "rope_parameters": {
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                  "mrope_section": [2, 3, 3]},
            "full_attention": None}}}),
})


@functools.cache
def tokenizer_dir() -> Path:
    """A byte-level BPE tokenizer trained on CORPUS, saved in HF format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    out = Path(tempfile.mkdtemp(prefix="cllm-tok-"))
    fast.save_pretrained(out)
    return out


# config classes whose model no transformers Auto class builds or loads (Emu3's text model:
# AutoModelForCausalLM maps the composite Emu3Config alone) -> that model's class
NO_AUTO_CLASS = {"Emu3TextConfig": "Emu3ForCausalLM"}


def _image_text(config: dict) -> bool:
    """Whether a config (extras or config.json) is an image-text-to-text model's: a vision
    tower's, or Emu3's VQ-VAE's."""
    return "vision_config" in config or "vq_config" in config


@functools.cache
def make_checkpoint(name: str, dtype: str = "float32") -> Path:
    """Save a tiny random model of config `name` with the test tokenizer; returns its dir."""
    import transformers

    cls_name, extra = {**CONFIGS, **EXTRA_CONFIGS}[name]
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    text = {"vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "bos_token_id": None,
            **SMALL}
    auto = transformers.AutoModelForCausalLM
    if _image_text(extra):  # image-text-to-text: SMALL and the tokens size its text model
        text, extra = {}, {**extra, "text_config": {**text, **extra.get("text_config", {})}}
        auto = transformers.AutoModelForImageTextToText
    cfg = getattr(transformers, cls_name)(**{**text, **extra})
    torch.manual_seed(0)
    if cls_name in NO_AUTO_CLASS:  # a config no Auto class maps: its model class builds it
        model = getattr(transformers, NO_AUTO_CLASS[cls_name])._from_config(cfg)
    else:
        model = auto.from_config(cfg)
    model = model.to(getattr(torch, dtype))
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out



def engine_config(name: str, drop: tuple[str, ...] = (), **changes):
    """Our config of checkpoint `name`'s config.json less the keys in `drop`, with `changes`."""
    from compiled_llm.worker.loader import build_model_config, load_hf_config

    hf = {key: value for key, value in load_hf_config(make_checkpoint(name)).items()
          if key not in drop}
    return build_model_config({**hf, **changes})[1]

def hf_model(model_dir: Path):
    """transformers' model of the checkpoint, in eval mode; soft-capped attention (Gemma 2) on
    transformers' eager path, the one that applies the cap whatever its version's default."""
    import json

    import transformers

    config = json.loads((Path(model_dir) / "config.json").read_text())
    capped = config.get("attn_logit_softcapping")
    auto = (transformers.AutoModelForImageTextToText if _image_text(config)
            else transformers.AutoModelForCausalLM)  # an image-text-to-text model: its own
    arch = (config.get("architectures") or [None])[0]
    if arch in NO_AUTO_CLASS.values():
        auto = getattr(transformers, arch)
    return auto.from_pretrained(
        model_dir, **({"attn_implementation": "eager"} if capped else {})).eval()


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time (no padding effects)."""
    model = hf_model(model_dir)
    outs = []
    for p in prompts:
        with torch.no_grad():
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens,
                                 do_sample=False, min_new_tokens=max_new_tokens,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(ids[0, len(p):].tolist())
    return outs


@functools.cache
def edited_checkpoint(name: str, edit, seed: int = 5, extra: tuple = ()) -> Path:
    """A copy of make_checkpoint(name) in a new dir, each tensor replaced by edit(key, tensor,
    generator) unless that gives None (transformers saves norm weights of 1 and biases of 0,
    under which a misplaced norm or bias would never show), the (key, tensor) of extra added."""
    from safetensors.torch import load_file, save_file

    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-edited-"))
    shutil.copytree(make_checkpoint(name), out, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for path in out.glob("*.safetensors"):
        tensors = load_file(path)
        for key, value in tensors.items():
            edited = edit(key, value, gen)
            tensors[key] = value if edited is None else edited.to(value.dtype)
        save_file({**tensors, **dict(extra)}, path, metadata={"format": "pt"})
    return out


def assert_matches_transformers(ckpt: Path, new_tokens: int = 16, hi: int = 50,
                                atol: float = 1e-4) -> None:
    """LLM on ckpt (eager, float32) gives transformers' greedy tokens on six prompts and its
    prompt logprobs on three, within atol."""
    from compiled_llm import LLM, SamplingParams

    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    vocab = llm.engine.model_config.vocab_size
    prompts = random_prompts(6, vocab, hi=hi, seed=3)
    greedy = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts, new_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params, use_tqdm=False)
    llm.shutdown()
    hf = hf_model(ckpt)
    for prompt, out in zip(prompts[:3], outs):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        expected = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])
        torch.testing.assert_close(got, expected, atol=atol, rtol=atol)


def random_norms_and_correction_bias(key: str, value: torch.Tensor, gen: torch.Generator):
    """An edited_checkpoint edit: norm weights around 1 and routers' correction biases around
    0, random (transformers saves ones and zeros, under which a misplaced one never shows)."""
    if key.endswith("e_score_correction_bias"):
        return torch.randn(value.shape, generator=gen) * 0.05
    if key.endswith("norm.weight"):
        return 1.0 + torch.randn(value.shape, generator=gen) * 0.2
    return None


def random_prompts(n: int, vocab: int, lo: int = 3, hi: int = 60, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (length,), generator=g).tolist() for length in lens]


class HostSyncWatch:
    """While active, records the calls that make the host wait for the device on CUDA, so a
    CPU test can catch them: a tensor made straight on a device (torch.tensor(..., device=):
    a pageable, blocking copy), a move to a device without non_blocking=True, and every read
    of a tensor's values (item, tolist, numpy, bool, int, float). Use as a context manager;
    `calls` lists what was seen."""

    _READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__")

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def _patch(self, owner, name: str, check) -> None:
        real = getattr(owner, name)
        self._saved.append((owner, name, real))

        def wrapper(*args, **kwargs):
            if check(args, kwargs):
                self.calls.append(name)
            return real(*args, **kwargs)

        setattr(owner, name, wrapper)

    def __enter__(self) -> HostSyncWatch:
        on_device = lambda args, kwargs: kwargs.get("device") is not None  # noqa: E731
        self._patch(torch, "tensor", on_device)
        self._patch(torch, "as_tensor", on_device)
        self._patch(torch.Tensor, "to", _blocking_move)
        self._patch(torch.Tensor, "cuda", lambda args, kwargs: not kwargs.get("non_blocking"))
        for name in self._READS:
            self._patch(torch.Tensor, name, lambda args, kwargs: True)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()


def _blocking_move(args, kwargs) -> bool:
    """Whether a Tensor.to call names a device (or another tensor) but not non_blocking=True."""
    moves = "device" in kwargs or any(isinstance(a, (torch.device, str, torch.Tensor))
                                      for a in args[1:])
    non_blocking = kwargs.get("non_blocking") or any(a is True for a in args[1:])
    return moves and not non_blocking


CHATML_SPECIALS = ["<|endoftext|>", "<s>", "<|im_end|>", "<|im_start|>"]  # ids 0-3


def make_chatml_checkpoint() -> Path:
    """A tiny Llama whose tokenizer is ChatML-style, as chat fine-tunes ship: a BOS added to
    every encode, its EOS <|im_end|> (id 2) where config.json names <|endoftext|> (id 0),
    and <|im_start|> (id 3) a special added token that all_special_ids does not list."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=CHATML_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                          "assistant\n{% endif %}")
    cfg = transformers.LlamaConfig(vocab_size=len(fast), eos_token_id=0, bos_token_id=1, **SMALL)
    torch.manual_seed(0)
    out = Path(tempfile.mkdtemp(prefix="cllm-chatml-"))
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


class ForceTokens:
    """A logits processor making ids[k] the top token at output position k."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if len(output_ids) < len(self.ids):
            logits[self.ids[len(output_ids)]] += 1000.0
        return logits
