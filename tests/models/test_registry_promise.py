"""The promise over the model registry: every registered architecture compiles with the
compiled-llm backend, matches eager, and gets its expected fusions at every site (the fused
[q/k norm +] RoPE + KV write included: once per layer, before the split at attention; the
small-M GEMM's SiLU·mul and add + RMSNorm epilogues).

Mixture-of-experts layers: the routed experts are one `compiled_llm::fused_moe` call per sparse
layer per step, inside the layer's piece (the graph is split at attention only); their SiLU·mul
is inside that op, so the SiLU·mul and gate/up fusions count dense MLPs and shared experts."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from compiled_llm.models import ModelRegistry
from compiled_llm.models.multimodal import CONDITIONAL_GENERATION
from tests.utils import make_checkpoint, random_prompts

ARCH_CONFIG = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
               "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
               "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral",
               "Qwen2MoeForCausalLM": "qwen2_moe", "Phi3ForCausalLM": "phi3",
               "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
               "Gemma3ForCausalLM": "gemma3", "Gemma4ForCausalLM": "gemma4",
               "Gemma3nForCausalLM": "gemma3n",
               "GraniteForCausalLM": "granite",
               "SmolLM3ForCausalLM": "smollm3", "Olmo2ForCausalLM": "olmo2",
               "OlmoForCausalLM": "olmo", "Olmo3ForCausalLM": "olmo3",
               "OlmoeForCausalLM": "olmoe",
               "FlexOlmoForCausalLM": "flex_olmo",
               "DbrxForCausalLM": "dbrx",
               "PhimoeForCausalLM": "phimoe",
               "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe",
               "MiniMaxM2ForCausalLM": "minimax_m2",
               "GptOssForCausalLM": "gpt_oss",
               "GPTNeoXForCausalLM": "gpt_neox", "PhiForCausalLM": "phi",
               "OPTForCausalLM": "opt", "GPT2LMHeadModel": "gpt2",
               "BloomForCausalLM": "bloom_post_ln", "MptForCausalLM": "mpt",
               "Starcoder2ForCausalLM": "starcoder2", "StableLmForCausalLM": "stablelm",
               "GPTBigCodeForCausalLM": "gpt_bigcode",
               "CohereForCausalLM": "cohere", "GPTJForCausalLM": "gptj",
               "Cohere2ForCausalLM": "cohere2", "Exaone4ForCausalLM": "exaone4",
               "HunYuanDenseV1ForCausalLM": "hunyuan",
               "GraniteMoeForCausalLM": "granitemoe",
               "MinistralForCausalLM": "ministral", "SeedOssForCausalLM": "seed_oss",
               "HeliumForCausalLM": "helium", "ArceeForCausalLM": "arcee",
               "Ernie4_5ForCausalLM": "ernie4_5_plain",
               "GraniteMoeSharedForCausalLM": "granitemoeshared",
               "Glm4MoeForCausalLM": "glm4_moe", "Dots1ForCausalLM": "dots1",
               "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
               "Glm4MoeLiteForCausalLM": "glm4_moe_lite", "MiniCPM3ForCausalLM": "minicpm3",
               "DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
               "AXK1ForCausalLM": "axk1", "AXK2ForCausalLM": "axk2",
               "BitNetForCausalLM": "bitnet",
               "ExaoneMoeForCausalLM": "exaone_moe",
               "Ernie4_5_MoeForCausalLM": "ernie4_5_moe_plain",
               "FalconForCausalLM": "falcon", "GlmForCausalLM": "glm",
               "NemotronForCausalLM": "nemotron",
               "PersimmonForCausalLM": "persimmon",
               "VaultGemmaForCausalLM": "vaultgemma",
               "ApertusForCausalLM": "apertus",
               "Ministral3ForCausalLM": "ministral3",
               "CwmForCausalLM": "cwm",
               "Jais2ForCausalLM": "jais2",
               "Glm4ForCausalLM": "glm4",
               "GPTNeoForCausalLM": "gpt_neo", "CodeGenForCausalLM": "codegen",
               "NanoChatForCausalLM": "nanochat", "Cohere2MoeForCausalLM": "cohere2_moe",
               "SolarOpenForCausalLM": "solar_open", "YoutuForCausalLM": "youtu",
               "HyperCLOVAXForCausalLM": "hyperclovax", "HYV3ForCausalLM": "hy_v3",
               "GraniteSWAForCausalLM": "granite_swa",
               "MellumForCausalLM": "mellum", "Llama4ForCausalLM": "llama4",
               "AfmoeForCausalLM": "afmoe",
               "MiMoV2FlashForCausalLM": "mimo_v2_flash",
               "LongcatFlashForCausalLM": "longcat_flash",
               "LagunaForCausalLM": "laguna", "GraniteMoeSWAForCausalLM": "granitemoe_swa",
               "HrmTextForCausalLM": "hrm_text",
               "AriaTextForCausalLM": "aria_text", "Emu3ForCausalLM": "emu3",
               "DiffLlamaForCausalLM": "diffllama", "JetMoeForCausalLM": "jetmoe",
               "CohereCompassForCausalLM": "cohere_compass_text"}
# the fused RoPE + KV write and the small-M GEMM ops are for CUDA by default; on CPU their ops
# run the reference (the models' arithmetic, eagerly), so the promise holds on CPU too (the
# gate/up SiLU·mul epilogue and the L2 weight prefetch, a no-op on CPU, are opt-in: asked for)
ON_CPU = {"qk_norm_rope_kv_write_on_cpu": True, "small_m_gemm_on_cpu": True,
          "enable_small_m_silu_mul": True, "enable_l2_weight_prefetch": True,
          "l2_weight_prefetch_on_cpu": True}
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# checkpoints with q/k/v as one qkv_proj and gate/up as one gate_up_proj (4 matmuls a layer)
PREFUSED = {"Phi3ForCausalLM"}
# every pattern of a Llama layer but its horizontal GEMM fusion: none of them is there
NO_LLAMA_PATTERNS = {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "SiluMulFusionPass": 0,
    "QKNormRoPEKVWriteFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0}
# layers of another shape: Gemma 3's norms scale by (1 + weight) after the float32 product and
# come after attention and around a GELU MLP, so no norm or SiLU·mul pattern is theirs; its
# q/k/v and gate/up still fuse, and RoPE + the KV write after its own q/k norms
# Granite's residual_multiplier sits between the o / down GEMMs and their residual add, so
# the small-M add + norm epilogues (and the prologues they feed) are not its
GEMMA_SHAPE = {"AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "SiluMulFusionPass": 0,
               "SmallMGemmSiluMulFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": 0,
               "SmallMAddRMSNormGemmFusionPass": 0}
# (Gemma 1 and 2 too: the same norms and GELU gate; Gemma 2's soft-capped attention is the
# attention op's softcap, which the fused RoPE + KV write carries)
OWN_LAYER_SHAPE = {
    # GPT-OSS: a biased o_proj (an addmm) and the experts' op: no GEMM output meets a norm
    "GptOssForCausalLM": lambda layers: {"SmallMGemmAddRMSNormFusionPass": 0},
    **dict.fromkeys(("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"),
                    lambda layers: GEMMA_SHAPE),
    # Gemma 4 (E2B's shape, four layers, the last two reading the first two's caches): its
    # weight-scaled float32 norms are RMSNorm's graph in float32 (where this test runs): five a
    # layer, the shared layers' q_norm, the PLE projection's and the final norm are plain
    # norms; one add + norm a layer; GELU MLPs; RoPE + the KV write fuse on the layers that
    # write a cache, whose q/k/v fuse beside every gate/up; no small-M add + norm
    "Gemma4ForCausalLM": lambda layers: {
        "AddRMSNormFusionPass": layers, "RMSNormFusionPass": 5 * layers + layers // 2 + 2,
        "SiluMulFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0,
        "QKNormRoPEKVWriteFusionPass": layers // 2,
        "HorizontalGemmFusionPass": layers // 2 + layers,
        "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # Gemma 3n (four layers, the last two reading the first two's caches): Gemma 4's norms
    # plus Laurel's and AltUp's router norm (predict, correct): eight plain norms a layer, the
    # shared layers' q_norm, the PLE projection's and the final norm; one add + norm a layer
    # (measured); GELU MLPs; RoPE + the KV write on the layers that write a cache
    "Gemma3nForCausalLM": lambda layers: {
        "AddRMSNormFusionPass": layers, "RMSNormFusionPass": 8 * layers + layers // 2 + 2,
        "SiluMulFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0,
        "QKNormRoPEKVWriteFusionPass": layers // 2,
        "HorizontalGemmFusionPass": layers // 2 + layers,
        "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # VaultGemma: Gemma 1's pre-norm layer (Gemma's norms and gate) with Gemma 2's attention
    "VaultGemmaForCausalLM": lambda layers: GEMMA_SHAPE,
    "GraniteForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # SmolLM3's NoPE layers (every second one here) have no RoPE to fuse with the KV write
    "SmolLM3ForCausalLM": lambda layers: {"QKNormRoPEKVWriteFusionPass": layers // 2},
    # OLMo 2 norms each block's output (and q, k over the whole projection) with no residual
    # in between: plain norms, four a layer, and the final norm's add
    # (OLMo 3 too: OLMo 2's layer, a window and a second rotary table apart)
    **dict.fromkeys(("Olmo2ForCausalLM", "Olmo3ForCausalLM"), lambda layers: {
    "AddRMSNormFusionPass": 1, "RMSNormFusionPass": 4 * layers,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0}),
    # FlexOlmo: OLMo 2's layer (its norms likewise plain) over an all-sparse MoE: only q/k/v
    # fuse horizontally, no dense SiLU·mul
    "FlexOlmoForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 1, "RMSNormFusionPass": 4 * layers,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # DBRX: LayerNorms, Wqkv one GEMM already, every layer sparse (no dense SiLU·mul); RoPE on
    # every dim (after the clamp) fuses with the KV write
    "DbrxForCausalLM": lambda layers: {
    **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0, "QKNormRoPEKVWriteFusionPass": layers},
    # PhiMoE: the Llama body with biased LayerNorms, every layer sparse: its (biased) q/k/v
    # fuse, and RoPE (every dim) with the KV write; no norm or dense SiLU·mul pattern
    "PhimoeForCausalLM": lambda layers: {
    **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers,
    "QKNormRoPEKVWriteFusionPass": layers},
    # HunYuan MoE: HunYuan dense's q/k norms after RoPE (two more add + norms a layer, no
    # fused RoPE + KV write); the MoE output (experts plus the shared MLP) is no single GEMM's
    # and o_proj is biased (an addmm): no small-M add + norm epilogue nor prologue
    "HunYuanMoEV1ForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 4 * layers, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # MiniMax-M2: RoPE on the leading half of each head (a split and a cat: no fused RoPE + KV
    # write); its q/k norms over the whole projection are plain norms, two a layer
    "MiniMaxM2ForCausalLM": lambda layers: {
    "QKNormRoPEKVWriteFusionPass": 0, "RMSNormFusionPass": 1 + 2 * layers},
    # OLMo 1: the Llama body with non-parametric LayerNorms: q/k/v and gate/up fuse, SiLU·mul
    # (with its GEMM), RoPE (after the q/k/v clamp) with the KV write; no norm pattern
    "OlmoForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # OLMoE: its q/k norms over the whole projection (the clamp after them) are plain norms,
    # two a layer, beside the first layer's input norm
    "OlmoeForCausalLM": lambda layers: {"RMSNormFusionPass": 1 + 2 * layers},
    # OPT and GPT-2: LayerNorms, an ungated MLP (fc1 / c_fc -> relu / gelu_new), learned
    # positions (no RoPE): only OPT's q/k/v fuse; GPT-2's c_attn is one GEMM already
    "OPTForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers},
    "GPT2LMHeadModel": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0},
    # Bloom and MPT: LayerNorms, one fused qkv GEMM, a gelu MLP, ALiBi (no RoPE to fuse)
    **dict.fromkeys(("BloomForCausalLM", "MptForCausalLM"), lambda layers: {
        **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0}),
    # GPT-NeoX and Phi: LayerNorms, an ungated gelu MLP, RoPE on part of each head (a split
    # and a cat the fused RoPE + KV write does not match): Phi's q/k/v fuse; NeoX's
    # query_key_value is one GEMM already
    "GPTNeoXForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0},
    "PhiForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers},
    # StarCoder2: the Llama body with LayerNorms and an ungated c_fc / c_proj MLP: its q/k/v
    # fuse, and RoPE (every dim) with the KV write; no norm or SiLU·mul pattern
    "Starcoder2ForCausalLM": lambda layers: {
    **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers,
    "QKNormRoPEKVWriteFusionPass": layers},
    # StableLM: the Llama body with LayerNorms and partial RoPE (a split and a cat): q/k/v and
    # gate/up fuse, and SiLU·mul (with its GEMM); no norm pattern, no fused RoPE + KV write
    "StableLmForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # GPTBigCode: GPT-2's shape over nn.Linear weights: c_attn is one GEMM already
    "GPTBigCodeForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0},
    # Cohere: the Llama body with LayerNorms and RoPE on interleaved pairs, attention and the
    # gated MLP off one norm: q/k/v and gate/up fuse, and SiLU·mul (with its GEMM); no norm
    # pattern, no fused RoPE + KV write
    "CohereForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # Cohere 2: Cohere's layer (its full layers have no RoPE at all): Cohere's fusions
    "Cohere2ForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # EXAONE 4.0: OLMo 2's post-norms (two plain norms a layer, the final norm's add); its
    # per-head q/k norms fuse with RoPE + the KV write on the sliding layers (the first of
    # two here) and are two plain norms on the full NoPE ones
    "Exaone4ForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 1, "RMSNormFusionPass": 2 * layers + 2 * (layers // 2),
    "QKNormRoPEKVWriteFusionPass": layers // 2,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # HunYuan: q/k norms after RoPE: RoPE's closing add + each norm is an add + norm (two more
    # a layer), and RoPE does not reach the KV write; its biased o_proj (an addmm) gets no
    # small-M add + norm epilogue, so no norm moves into gate/up (nor into the biased q/k/v)
    "HunYuanDenseV1ForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 4 * layers, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": layers, "SmallMAddRMSNormGemmFusionPass": 0},
    # GPT-J: LayerNorms, an ungated gelu_new MLP, interleaved partial RoPE: its q/k/v fuse
    "GPTJForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers},
    # GraniteMoe: Granite's residual_multiplier after o_proj (its MoE output is no GEMM's)
    "GraniteMoeForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # GraniteMoeShared: GraniteMoe's, and its shared MLP's gate_up_proj is one GEMM already
    # (only q/k/v fuse; its SiLU·mul still does)
    "GraniteMoeSharedForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # GLM-4.5: RoPE on the leading half of each head (a split and a cat: no fused RoPE + KV
    # write), so its per-head q/k norms (use_qk_norm) are plain norms, two a layer
    "Glm4MoeForCausalLM": lambda layers: {
    "QKNormRoPEKVWriteFusionPass": 0, "RMSNormFusionPass": 1 + 2 * layers},
    # dots.llm1 (attention_bias on o_proj too): a biased o_proj is an addmm, no small-M GEMM,
    # so only the one dense layer's down_proj takes the add + norm epilogue, and no norm
    # reaches a GEMM's prologue (the dense gate/up's norm follows o_proj)
    "Dots1ForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": 1, "SmallMAddRMSNormGemmFusionPass": 0},
    # DeepSeek-V2/V3 (MLA): no k_proj / v_proj, so only each layer's gate/up (a dense MLP's
    # or the shared expert's) fuse horizontally; RoPE on the split-off rope dims of q and of
    # the one k_pe head, then cat and pad: no fused RoPE + KV write; the latent norms
    # (kv_a_layernorm, and V3's q_a_layernorm) are plain norms; the input norm feeds two
    # GEMMs (q_proj or q_a_proj, and kv_a_proj_with_mqa), none takes it as a prologue, so
    # only the dense layer's gate/up does. The V2 case's attention_bias biases o_proj (an
    # addmm): only the dense down_proj takes the add + norm epilogue, and no norm a prologue
    "DeepseekV2ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + layers, "SmallMGemmAddRMSNormFusionPass": 1,
    "SmallMAddRMSNormGemmFusionPass": 0},
    "DeepseekV3ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMAddRMSNormGemmFusionPass": 1},
    # GLM-4.7-Flash: V3's MLA layer (q latent: two latent norms a layer) with V2's biases,
    # so only the one dense layer's down_proj takes the add + norm epilogue, no norm a prologue
    "Glm4MoeLiteForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmAddRMSNormFusionPass": 1,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # DeepSeek-V3.2 and GLM-5 (within index_topk: V3's MLA, the indexer skipped): V3's case,
    # and GLM-4.7-Flash's biased one
    "DeepseekV32ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMAddRMSNormGemmFusionPass": 1},
    "GlmMoeDsaForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmAddRMSNormFusionPass": 1,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # A.X-K1: V3's case, and each MoE layer's (all but the first here) post_mlp_layernorm
    # norms the sum of experts and shared expert: one more add + norm, its add the shared
    # expert's down_proj epilogue
    "AXK1ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMAddRMSNormGemmFusionPass": 1,
    "AddRMSNormFusionPass": 3 * layers - 1, "SmallMGemmAddRMSNormFusionPass": 2 * layers},
    # A.X-K2: V3.2's case; o_proj reads the gated attention output (no weight prefetch before
    # attention); the gated norms' gate MLPs (silu, no mul) fuse nothing
    "AXK2ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMAddRMSNormGemmFusionPass": 1,
    "L2WeightPrefetchPass": 0},
    # BitNet: the Llama layer with plain sub-norms before o_proj (no weight prefetch before
    # attention) and down_proj, two a layer; a relu2 gate (no SiLU·mul)
    "BitNetForCausalLM": lambda layers: {
    "RMSNormFusionPass": 1 + 2 * layers, "SiluMulFusionPass": 0,
    "SmallMGemmSiluMulFusionPass": 0, "L2WeightPrefetchPass": 0},
    # K-EXAONE: pre-norm Llama layers (a Llama layer's fusions) with EXAONE 4.0's attention:
    # q/k norms fuse with RoPE + the KV write on the sliding layers (every second one here)
    # and are two plain norms on the full NoPE ones
    "ExaoneMoeForCausalLM": lambda layers: {
    "RMSNormFusionPass": 1 + 2 * (layers // 2), "QKNormRoPEKVWriteFusionPass": layers // 2},
    # MiniCPM3: MLA (two latent norms a layer, no q/k/v, no fused RoPE + KV write) in a dense
    # layer biased everywhere (mlp_bias here): gate/up fuse but are an addmm, no small-M GEMM,
    # and Granite's residual scale follows o_proj and down_proj: no small-M fusion at all
    "MiniCPM3ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmSiluMulFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # ERNIE 4.5 MoE: ERNIE 4.5's float32 interleaved RoPE (no fused RoPE + KV write)
    "Ernie4_5_MoeForCausalLM": lambda layers: {"QKNormRoPEKVWriteFusionPass": 0},
    # Falcon: LayerNorms, an ungated gelu MLP, query_key_value one GEMM already; RoPE on every
    # dim, so RoPE + the KV write fuse
    "FalconForCausalLM": lambda layers: {
    **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0, "QKNormRoPEKVWriteFusionPass": layers},
    # GLM: the Llama layer with gate_up_proj already one GEMM (its q/k/v fuse) and interleaved
    # partial RoPE (no fused RoPE + KV write); GLM-4-0414's post-block norms are plain norms
    # with no GEMM's residual add before them
    "GlmForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0},
    # Seed-OSS (attention_out_bias here): its biased o_proj is an addmm, no small-M GEMM, so
    # only down_proj takes the add + norm epilogue, and no norm reaches a GEMM's prologue (the
    # gate/up norm follows o_proj; q/k/v are biased)
    "SeedOssForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": layers, "SmallMAddRMSNormGemmFusionPass": 0},
    # Helium and ERNIE 4.5: RoPE on interleaved pairs (no fused RoPE + KV write); Helium's
    # float32-scaled norms are RMSNorm's graph in float32, where this test runs
    **dict.fromkeys(("HeliumForCausalLM", "Ernie4_5ForCausalLM"),
                    lambda layers: {"QKNormRoPEKVWriteFusionPass": 0}),
    # Llama 4: float32 RoPE on interleaved pairs, its weightless q/k norms after it, and NoPE
    # layers' queries scaled per position: no fused RoPE + KV write
    "Llama4ForCausalLM": lambda layers: {"QKNormRoPEKVWriteFusionPass": 0},
    # Arcee: an ungated up_proj -> relu2 -> down_proj MLP: only q/k/v fuse, no SiLU·mul; the
    # post-attention norm still moves into up_proj's GEMM
    "ArceeForCausalLM": lambda layers: {
    "SiluMulFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0,
    "HorizontalGemmFusionPass": layers},
    # Nemotron: the Llama body with (1 + weight) LayerNorms, partial RoPE (a split and a cat)
    # and an ungated relu2 MLP: only q/k/v fuse; no norm, SiLU·mul or fused RoPE + KV write
    "NemotronForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers},
    # Persimmon: GPT-NeoX's [H, 3, D] query_key_value (one GEMM already), LayerNorms (and
    # per-head q/k LayerNorms), partial RoPE and an ungated relu2 MLP: no pattern of Llama's
    "PersimmonForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0},
    # Apertus: Arcee's ungated MLP (xIELU here) under Qwen3's attention (its q/k norms fuse
    # with RoPE + the KV write); attention_bias (here) biases o_proj, an addmm, so only
    # down_proj takes the add + norm epilogue and no norm reaches a GEMM's prologue (as Seed-OSS)
    "ApertusForCausalLM": lambda layers: {
    "SiluMulFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0, "HorizontalGemmFusionPass": layers,
    "SmallMGemmAddRMSNormFusionPass": layers, "SmallMAddRMSNormGemmFusionPass": 0},
    # Ministral 3: the Llama layer, its queries scaled per position between RoPE and the KV
    # write, so RoPE does not fuse with the write
    "Ministral3ForCausalLM": lambda layers: {"QKNormRoPEKVWriteFusionPass": 0},
    # CWM: the Llama layer; mlp_bias (here) makes gate/up and down_proj addmms, no small-M
    # GEMMs: only o_proj takes the add + norm epilogue, and no norm reaches a GEMM's prologue
    # (the gate/up norm's GEMM is biased, the next q/k/v norm follows down_proj)
    "CwmForCausalLM": lambda layers: {
    "SmallMGemmSiluMulFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": layers,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # Jais 2: StarCoder2's shape (LayerNorms on the Llama body, an ungated relu2 MLP): its
    # q/k/v fuse, and RoPE (every dim) with the KV write; no norm or SiLU·mul pattern
    "Jais2ForCausalLM": lambda layers: {
    **NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers,
    "QKNormRoPEKVWriteFusionPass": layers},
    "Glm4ForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # Cohere 2 MoE: Cohere 2's layer (LayerNorms here) over a dense first MLP and experts with
    # a shared one: Cohere's fusions (q/k/v and every gate/up fuse, with their SiLU·mul)
    "Cohere2MoeForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0},
    # Youtu: DeepSeek-V3's MLA in dense Llama layers (no k_proj / v_proj: only gate/up fuse;
    # no fused RoPE + KV write; two latent norms a layer, plain norms); attention_bias (here)
    # biases o_proj, an addmm: only down_proj takes the add + norm epilogue, no norm a
    # GEMM's prologue (as Seed-OSS)
    "YoutuForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmAddRMSNormFusionPass": layers,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # (Solar Open: a Llama layer over GLM-4.5's MoE, every layer sparse: the defaults)
    # Mellum: Qwen3-MoE's layer (a dense first layer here); attention_bias (here) biases
    # o_proj, an addmm: only the dense layer's down_proj takes the add + norm epilogue, and no
    # norm reaches a GEMM's prologue
    "MellumForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": 1, "SmallMAddRMSNormGemmFusionPass": 0},
    # HyperCLOVA X: post_norm1 / 2 on each block's output are plain norms (two a layer), and
    # residual_multiplier follows them: no GEMM output meets an add + norm, no small-M fusion
    "HyperCLOVAXForCausalLM": lambda layers: {
    "RMSNormFusionPass": 1 + 2 * layers, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # Hy3 (dots.llm1's layer: a sparse layer, then a dense one): attention_bias (here) biases
    # o_proj, an addmm: only the dense down_proj takes the add + norm epilogue, no norm a
    # GEMM's prologue
    "HYV3ForCausalLM": lambda layers: {
    "SmallMGemmAddRMSNormFusionPass": 1, "SmallMAddRMSNormGemmFusionPass": 0},
    # Granite SWA (three layers: RoPE, NoPE, RoPE): RoPE rides in the fused attention op, so
    # the two middle pieces (an MLP, then the next layer's q/k/v) are one compiled piece whose
    # fusions count once; RoPE + the KV write fuse on its two RoPE layers; Granite's residual
    # scale after o_proj and down_proj: no small-M add + norm
    "GraniteSWAForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 2 * (layers - 1), "SiluMulFusionPass": layers - 1,
    "HorizontalGemmFusionPass": 2 * (layers - 1), "SmallMGemmSiluMulFusionPass": layers - 1,
    "QKNormRoPEKVWriteFusionPass": 2, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # AFMoE (three layers: dense, then two sparse): its norms scale in float32 after the
    # product (RMSNorm's graph in float32, where this test runs), not the per-head norm the fused
    # RoPE + KV write takes: RoPE + the write fuse on the two sliding layers, each q/k norm is a
    # plain norm, as are the first input norm, every post-attention norm and the dense
    # post-MLP norm; the add + norms are the later input norms, every pre-MLP norm, the final
    # norm and the sparse layers' post-MLP norms (experts + shared expert), whose shared
    # down_proj takes the small-M add + norm epilogue. o_proj reads the gated attention output
    # (no prefetch) and is biased (attention_bias here): no norm reaches a GEMM's prologue
    "AfmoeForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 3 * layers - 1, "RMSNormFusionPass": 2 + 3 * layers,
    "QKNormRoPEKVWriteFusionPass": 2, "SmallMGemmAddRMSNormFusionPass": layers - 1,
    "SmallMAddRMSNormGemmFusionPass": 0, "L2WeightPrefetchPass": 0},
    # Laguna (sliding dense, full sparse, sliding sparse; attention_bias here): RoPE + the KV
    # write fuse with the q/k norms on the sliding layers (every dim turned); the full layer
    # turns half of each head (a split and a cat), so its q/k norms are plain norms beside the
    # first input norm; biased o_proj (an addmm) reading the gated output: no prefetch, only
    # the dense down_proj takes the add + norm epilogue, and no norm reaches a GEMM's prologue
    "LagunaForCausalLM": lambda layers: {
    "QKNormRoPEKVWriteFusionPass": layers - 1, "RMSNormFusionPass": 3,
    "SmallMGemmAddRMSNormFusionPass": 1, "SmallMAddRMSNormGemmFusionPass": 0,
    "L2WeightPrefetchPass": 0},
    # GraniteMoeSWA (three sparse layers: RoPE, NoPE, RoPE): Granite SWA's pieces (the two
    # middle ones compile once, so their fusions count once; RoPE + the KV write fuse on the
    # two RoPE layers) over GraniteMoeShared's layer (its shared MLP's gate_up_proj one GEMM
    # already: only q/k/v fuse); Granite's residual scale: no small-M add + norm
    "GraniteMoeSWAForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 2 * (layers - 1), "SiluMulFusionPass": layers - 1,
    "HorizontalGemmFusionPass": layers - 1, "SmallMGemmSiluMulFusionPass": layers - 1,
    "QKNormRoPEKVWriteFusionPass": 2, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # HRM-Text (layers counts KV slots: 2 layers a stack run 2 x (1 + 1) times, 8 attentions):
    # pieces alike compile once: the first (z_L_init + z_H -> add + norm), one within a stack
    # (two add + norms), the L -> H and H -> L hand-overs (three each: post-attention, the
    # stack's final norm, the next input norm) and the last (two): 11 add + norms, 4 MLPs;
    # RoPE + the KV write fuse on every attention; gqkv_proj and gate_up_proj are one GEMM
    # already, every linear is biased here (addmm: no small-M GEMM), o_proj reads the gated
    # output (no prefetch)
    "HrmTextForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 11, "RMSNormFusionPass": 0, "SiluMulFusionPass": 4,
    "HorizontalGemmFusionPass": 0, "SmallMGemmSiluMulFusionPass": 0,
    "SmallMGemmAddRMSNormFusionPass": 0, "SmallMAddRMSNormGemmFusionPass": 0,
    "L2WeightPrefetchPass": 0},
    # MiMo-V2-Flash: the Llama layer (GLM-4.5's experts, no shared one), RoPE on the leading
    # dims of each head (a split and a cat), q/k/v zero-padded to the cache's head dim: no
    # fused RoPE + KV write
    "MiMoV2FlashForCausalLM": lambda layers: {"QKNormRoPEKVWriteFusionPass": 0},
    # LongCat-Flash (layers counts attentions, two a decoder layer; the middle pieces of the
    # two decoder layers are alike and compile once): DeepSeek-V3's MLA (plain latent norms,
    # no fused RoPE + KV write, the input norm feeding two GEMMs); each piece after an
    # attention has two add + norms and its o_proj's epilogue, and each dense MLP's down_proj
    # its own; the dense mlps.0 / mlps.1 are no SIBLINGS parent (no gate/up fusion); the
    # post-attention norm also feeds the MoE router: no norm a GEMM's prologue
    "LongcatFlashForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 6, "RMSNormFusionPass": 7, "SiluMulFusionPass": 3,
    "HorizontalGemmFusionPass": 0, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmSiluMulFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": 6,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # GPT-Neo: GPT-2's shape (LayerNorms, an ungated gelu_new MLP, learned positions) with
    # q/k/v as three linears under attn: they fuse
    "GPTNeoForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": layers},
    # CodeGen: GPT-J's layer with qkv_proj one GEMM already (reordered at load)
    "CodeGenForCausalLM": lambda layers: {**NO_LLAMA_PATTERNS, "HorizontalGemmFusionPass": 0},
    # NanoChat: weightless RMSNorms (a ones buffer: Llama's norm graph), one more on the
    # embeddings (a second plain norm); q/k normed after RoPE (RoPE's closing add + each norm
    # is an add + norm, two more a layer, and RoPE does not reach the KV write); an ungated
    # relu2 MLP (only q/k/v fuse, no SiLU·mul); its biased o_proj (attention_bias here) is an
    # addmm, so only fc2 takes the add + norm epilogue, and no norm reaches a GEMM's prologue
    "NanoChatForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 4 * layers, "RMSNormFusionPass": 2, "SiluMulFusionPass": 0,
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmSiluMulFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": layers,
    "SmallMAddRMSNormGemmFusionPass": 0},
    # DiffLlama (layers counts attention maps, two a decoder layer): the Llama layer's norms,
    # q/k/v and gate/up per decoder layer; each map's q/k halves are cut and doubled after
    # RoPE (no fused RoPE + KV write), no o projection follows an attention directly (no
    # prefetch); its biased o_proj (attention_bias here) is an addmm: only down_proj takes
    # the add + norm epilogue, and no norm reaches a GEMM's prologue
    "DiffLlamaForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": layers, "SiluMulFusionPass": layers // 2,
    "HorizontalGemmFusionPass": layers, "QKNormRoPEKVWriteFusionPass": 0,
    "SmallMGemmSiluMulFusionPass": layers // 2, "SmallMGemmAddRMSNormFusionPass": layers // 2,
    "SmallMAddRMSNormGemmFusionPass": 0, "L2WeightPrefetchPass": 0},
    # JetMoE: one kv_proj GEMM and expert-stacked query projections (nothing to fuse
    # horizontally), every MLP routed (no dense SiLU·mul); the MoA's and the MoE's outputs are
    # sums over experts plus a bias, no GEMM's output meets a norm; no o_proj to prefetch
    "JetMoeForCausalLM": lambda layers: {
    "HorizontalGemmFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": 0,
    "L2WeightPrefetchPass": 0},
    # Cohere Compass: Cohere's LayerNorm layer (no norm pattern) with rotate-half RoPE on every
    # layer here, which fuses with the KV write
    "CohereCompassForCausalLM": lambda layers: {
    "AddRMSNormFusionPass": 0, "RMSNormFusionPass": 0, "SmallMGemmAddRMSNormFusionPass": 0,
    "SmallMAddRMSNormGemmFusionPass": 0}}
# pooling-only architectures: their compiled-against-eager cases are in tests/entrypoints/pooling
POOLING_ARCHS = {"BertModel", "BertForSequenceClassification", "LlamaForSequenceClassification",
                 "RobertaModel", "XLMRobertaModel", "RobertaForSequenceClassification",
                 "XLMRobertaForSequenceClassification", "LlamaModel", "MistralModel",
                 "Qwen2Model", "Qwen3Model", "Gemma3TextModel", "ModernBertModel",
                 "ModernBertForSequenceClassification",
                 "Qwen2ForSequenceClassification", "Qwen3ForSequenceClassification",
                 "MistralForSequenceClassification"}


def test_every_registered_architecture_has_a_promise_case():
    """An image-text-to-text architecture is served on its text models' classes: their cases
    are its promise (tests/models/test_multimodal_text_only.py checks its checkpoints)."""
    texts = {text for table, _ in CONDITIONAL_GENERATION.values() for text in table.values()}
    assert texts <= set(ARCH_CONFIG)
    assert set(ARCH_CONFIG) | POOLING_ARCHS | set(CONDITIONAL_GENERATION) == set(
        ModelRegistry.get_supported_archs())


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIG))
def test_compiles_matches_eager_and_fuses(arch, monkeypatch):
    ckpt = make_checkpoint(ARCH_CONFIG[arch])
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=30, seed=11)]
    eager = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    ref = [o.outputs[0].token_ids for o in eager.generate(prompts, PARAMS, use_tqdm=False)]
    counters.reset()
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")  # no cache of ours, nor Inductor's:
    with torch._inductor.config.patch(fx_graph_cache=False):  # the passes must really run
        llm = LLM(str(ckpt), dtype="float32", compile_mode="backend", passes=ON_CPU)
    cfg = llm.engine.model_config
    layers = cfg.num_hidden_layers
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == ref
    sparse = sum(cfg.moe.is_sparse(i) for i in range(layers)) if cfg.moe else 0
    shared = sparse if cfg.moe and cfg.moe.shared_expert_intermediate_size else 0
    gated_mlps = layers - sparse + shared  # dense MLPs and shared experts
    dense = [i for i in range(layers) if not (cfg.moe and cfg.moe.is_sparse(i))]
    expected = {
        "AddRMSNormFusionPass": 2 * layers,  # post-attention and next/final norm
        # the first layer's input norm; Qwen3's q/k norms are inside the fused RoPE + KV write
        "RMSNormFusionPass": 1,
        "SiluMulFusionPass": gated_mlps,
        # q/k/v, every gate/up; none where the checkpoint already holds them as one
        "HorizontalGemmFusionPass": 0 if arch in PREFUSED else layers + gated_mlps,
        "QKNormRoPEKVWriteFusionPass": layers,  # [q/k norm +] RoPE + KV write, one op
        "SmallMGemmSiluMulFusionPass": gated_mlps,  # the gate/up GEMM's (opt-in)
        # o_proj's and each dense down_proj's add + norm (MoE outputs are no single GEMM's)
        "SmallMGemmAddRMSNormFusionPass": 2 * layers - sparse,
        # those norms move into the GEMM after them: a dense layer's gate/up, the next
        # layer's qkv (not a biased qkv: an addmm, not a small-M GEMM)
        "SmallMAddRMSNormGemmFusionPass": len(dense) + (0 if cfg.attention_bias else sum(
            i < layers - 1 for i in dense)),
        "L2WeightPrefetchPass": layers,  # the o projection's weight, before each attention
    }
    expected.update(OWN_LAYER_SHAPE.get(arch, lambda n: {})(layers))
    assert {name: counters.pass_matches[name] for name in expected} == expected
    assert counters.graph_breaks == 0 and counters.recompiles == 0
    assert counters.pieces == layers + 1  # split at attention alone, never at the MoE op
    assert moe_calls_per_step(llm, monkeypatch) == sparse


def moe_calls_per_step(llm: LLM, monkeypatch) -> int:
    """How many times one compiled forward step (a one-token generate) runs the MoE op."""
    import compiled_llm.moe as moe

    calls = []
    real = moe.fused_moe_reference
    monkeypatch.setattr(moe, "fused_moe_reference",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], one, use_tqdm=False)
    return len(calls)
