"""Tensor parallelism over gloo in two processes on the models sharded by their own modules'
shard_for_tp beyond the common decoders (Gemma 4's per-layer head shapes and KV-shared layers,
its experts; Gemma 3n's AltUp layers and sparse MLPs; ...): greedy tokens equal one rank's and
prompt logprobs stay close."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.models.test_gemma3n import stub_vision_tower  # noqa: F401 (gemma3n_vl's fixture)
from tests.utils import make_checkpoint, random_prompts

pytestmark = pytest.mark.slow
BASE = dict(dtype="float32", max_model_len=128, engine_core_process=False,
            kv_cache_memory_bytes=4 << 20, enforce_eager=True)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1)
# gemma4: wider full layers (2 KV heads each), KV-shared layers, PLE, double-wide MLPs;
# gemma4_moe: the full layer's one KV head replicated (keys as values), experts beside the MLP;
# gemma3n: sparse MLPs of per-layer widths (the gate's statistics all-reduced); their
# image-text checkpoints' text stacks (gemma3n_vl: prompt ids from 256 take the vision / audio
# embedders beside the vocab-parallel table)
# dbrx: Wqkv's q | k | v rows (clamped), the experts' [E * I, H] stacks by each expert's rows
# bitnet: sub-norms over the split heads / intermediate (their mean squares all-reduced);
# diffllama_kv4: differential attention, each rank a share of both halves of q, k and v heads
# laguna: per-layer query heads (2 on the middle layer) and their g_proj gates, per-expert
# tensors beside a shared expert; cohere2_moe: Cohere's parallel layer, a dense first layer
# (48 wide), experts and a shared expert averaged in (summed, sigmoid-routed in the other)
# mimo_v2_flash: the full layers' one KV head replicated, the sliding layers' two split (their
# sinks too), 24-wide q/k and 16-wide v heads; afmoe: the attention gate's rows with the heads,
# a biased o_proj, ungated shared experts; longcat_flash: two MLA attentions and MLPs a layer,
# zero experts added on one rank; jetmoe: every attention expert's share of the KV heads, its
# biases added once; aria_text_options: Aria's transposed expert stacks, a biased shared MLP;
# codegen: qkv_proj's rows read from its 4 (q, v, k) blocks; hrm_text: transformers' split
# gate / q / k / v and gate / up tensors, each read as its part of the fused parameters
ARCHS = ["gemma4", "gemma4_moe", "gemma3n", "gemma4_vl", "gemma3n_vl", "dbrx", "bitnet",
         "diffllama_kv4", "laguna", "cohere2_moe", "cohere2_moe_sigmoid", "mimo_v2_flash",
         "afmoe", "longcat_flash", "jetmoe", "aria_text_options", "codegen", "hrm_text"]


def _run(ckpt, tp: int, **options):
    llm = LLM(str(ckpt), tensor_parallel_size=tp, **BASE, **options)
    try:
        prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=40, seed=5)]
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        if tp > 1:
            assert llm.engine.executor.tp.world_size == tp
            assert llm.engine.num_used_blocks == 0
        return outs
    finally:
        llm.shutdown()


@pytest.mark.usefixtures("stub_vision_tower")
@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_equals_tp1(arch):
    _assert_equal(make_checkpoint(arch))


@pytest.mark.parametrize("arch", ["gemma4_moe", "dbrx", "longcat_flash", "jetmoe",
                                  "aria_text"])
def test_tp2_expert_parallel_equals_tp1(arch):
    """Whole experts per rank: Gemma 4's stacked [E, ...] tensors, DBRX's [E * I, H] stacks
    read as one run of rows, LongCat's zero experts' picks spread over real ones, JetMoE's
    stacked [E, 2I, H], Aria's transposed [E, H, 2I]."""
    _assert_equal(make_checkpoint(arch), enable_expert_parallel=True)


def _assert_equal(ckpt, **options) -> None:
    for one, two in zip(_run(ckpt, 1), _run(ckpt, 2, **options), strict=True):
        assert one.outputs[0].token_ids == two.outputs[0].token_ids
        for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True):
            token = next(iter(a))
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-3)


def test_unsplittable_sizes_refused_by_name():
    """Before any rank starts: Gemma 4's full layers' KV heads, Gemma 3n's per-layer MLP
    widths, Laguna's per-layer query heads, DiffLlama's halves of its KV heads, MiMo-V2-Flash's
    sliding layers' KV heads, JetMoE's KV heads (each with its K query heads)."""
    from dataclasses import replace

    from compiled_llm.models.diffllama import DiffLlamaForCausalLM
    from compiled_llm.models.gemma3n import Gemma3nForCausalLM
    from compiled_llm.models.gemma4 import Gemma4ForCausalLM
    from compiled_llm.models.jetmoe import JetMoeForCausalLM
    from compiled_llm.models.laguna import LagunaForCausalLM
    from compiled_llm.models.mimo_v2_flash import MiMoV2FlashForCausalLM
    from tests.utils import engine_config

    for cls, cfg, world, match in (
            (Gemma4ForCausalLM, replace(engine_config("gemma4_moe"), global_kv_heads=3), 2,
             "size 2 must divide num_global_key_value_heads 3"),
            (Gemma3nForCausalLM, engine_config("gemma3n", intermediate_size=[128, 90, 128, 64]),
             4, "size 4 must divide intermediate_size 90"),
            (LagunaForCausalLM, engine_config("laguna"), 4,
             "size 4 must divide num_attention_heads_per_layer 2"),
            (DiffLlamaForCausalLM, engine_config("diffllama"), 2,
             "size 2 must divide half of num_key_value_heads 2"),
            (MiMoV2FlashForCausalLM, replace(engine_config("mimo_v2_flash"),
                                             num_key_value_heads=3), 4,
             "size 4 must divide the sliding layers' KV heads 6"),
            (JetMoeForCausalLM, engine_config("jetmoe"), 4,
             "size 4 must divide num_key_value_heads 2")):
        with pytest.raises(ValueError, match=match):
            cls.check_tensor_parallel(cfg, world)
