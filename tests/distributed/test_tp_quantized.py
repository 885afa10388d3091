"""Tensor parallelism over quantized checkpoints (GPTQ, AWQ, compressed-tensors W4A16 / INT8 /
FP8, FP8 blocks and per tensor) and quantization="fp8": each rank's linears are exactly its
rows / columns of the one-rank model's (every stored layout: packed along K or N, groups, zero
points, blocks, act order's padded groups); TP=2 over gloo gives TP=1's greedy tokens
(per-token activation quantization over split inputs: close prompt logprobs); splits the
packing, groups or blocks cannot follow are refused before any rank starts."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.loader import load_model
from tests.quantization.packers import fp8_moe_pair, packed_pair
from tests.utils import make_checkpoint, random_prompts

pytestmark = pytest.mark.slow
BASE = dict(dtype="float32", max_model_len=128, engine_core_process=False,
            kv_cache_memory_bytes=4 << 20, enforce_eager=True)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=0)
CPU = torch.device("cpu")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.up_proj",
           "mlp.down_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
ROW_PARALLEL_MARK = "Reduced"  # the class all-reducing a row-parallel quantized linear


def _dense(linear: torch.nn.Module) -> torch.Tensor:
    """The weight [N, K] a quantized linear multiplies by (its forward on the identity: exact
    for these layouts, activations of one nonzero per row quantize exactly), without a
    row-parallel linear's all-reduce."""
    reduced = ROW_PARALLEL_MARK in type(linear).__name__  # reduced_class(cls): cls first
    forward = (type(linear).__mro__[1] if reduced else type(linear)).forward
    return forward(linear, torch.eye(linear.in_features)).t()


@pytest.mark.parametrize("kind", ["gptq_asym", "awq", "ct_W4A16_ASYM", "ct_FP8_DYNAMIC",
                                  "fp8_block", "gptq_channel", "gptq_asym_v2", "ct_act_order"])
def test_each_rank_holds_its_rows_and_columns(kind):
    """In one process (no collective runs): every layout's slices, read by the plan, give
    rank r exactly rows (column parallel) or columns (row parallel) r of the whole weight."""
    quantized, _ = packed_pair(kind, wide=True)
    whole = load_model(quantized, torch.float32, CPU, 64)
    for rank in (0, 1):
        shard = load_model(quantized, torch.float32, CPU, 64,
                           tp=TPGroup(rank, 2, "unused", None, None))
        for name in LINEARS:
            full = _dense(whole.get_submodule(f"model.layers.0.{name}"))
            mine = shard.get_submodule(f"model.layers.0.{name}")
            row = name in ROW_PARALLEL
            assert (ROW_PARALLEL_MARK in type(mine).__name__) == row, name
            cols, rows = (full.shape[1] // 2, full.shape[0]) if row else (
                full.shape[1], full.shape[0] // 2)
            expected = full[:, rank * cols:(rank + 1) * cols] if row else full[
                rank * rows:(rank + 1) * rows]
            torch.testing.assert_close(_dense(mine), expected, rtol=0, atol=0, msg=name)


def _prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=40, seed=5)]


def _run(ckpt, tp: int, **kwargs):
    llm = LLM(str(ckpt), tensor_parallel_size=tp, **BASE, **kwargs)
    try:
        if tp > 1:
            assert llm.engine.executor.tp.world_size == tp
        outs = llm.generate(_prompts(), PARAMS, use_tqdm=False)
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()
    tokens = [o.outputs[0].token_ids for o in outs]
    logprobs = [[d[t].logprob for d, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:],
                                                     strict=True)]
                for o in outs]
    return tokens, torch.tensor(sum(logprobs, []))


# weight-only int4 (GPTQ asymmetric with act order: qzeros, g_idx, padded groups; AWQ: packed
# along N; compressed-tensors pack-quantized with zero points), FP8 blocks, per-tensor FP8 with
# static activations (one layer's down_proj left unquantized), INT8 with static asymmetric
# activations (the zero-point correction per rank's columns): the ranks' sums are TP=1's up to
# float32 order
EXACT = ("gptq_asym_v2", "awq", "ct_W4A16_ASYM", "fp8_block", "fp8_tensor_static",
         "ct_W8A8_STATIC_ASYM")


@pytest.mark.parametrize("kind", EXACT)
def test_tp2_greedy_equals_tp1(kind):
    quantized, _ = packed_pair(kind, wide=True)
    tokens, logprobs = _run(quantized, 1)
    tp_tokens, tp_logprobs = _run(quantized, 2)
    assert tp_tokens == tokens
    torch.testing.assert_close(tp_logprobs, logprobs, atol=1e-3, rtol=0)


def test_tp2_per_token_activations_close():
    """FP8 per channel, activations quantized per token: a row-parallel rank scales its own
    columns (as vLLM's ranks do), so logprobs are close, not equal."""
    quantized, _ = packed_pair("ct_FP8_DYNAMIC", wide=True)
    _, logprobs = _run(quantized, 1)
    _, tp_logprobs = _run(quantized, 2)
    torch.testing.assert_close(tp_logprobs, logprobs, atol=0.05, rtol=0)


def test_tp2_fp8_at_load_quantizes_each_shard():
    """quantization="fp8" on an unquantized checkpoint: each rank's shards are quantized after
    they load (a row-parallel one's per-row scales over its own columns, all-reduced), so the
    logprobs move from the unquantized model's by FP8's error (TP=1's here is 0.2), no more."""
    ckpt = make_checkpoint("llama")
    _, plain = _run(ckpt, 1)
    _, fp8 = _run(ckpt, 2, quantization="fp8")
    error = (fp8 - plain).abs().max().item()
    assert 1e-3 < error < 0.3


def test_tp2_block_fp8_experts_equal_tp1():
    """A block-FP8 Qwen3-MoE checkpoint: each rank's experts keep their 128-block rows of
    gate / up and columns of down with those blocks' scales, so TP=2 gives TP=1's tokens."""
    quantized, _ = fp8_moe_pair(wide=True)
    tokens, logprobs = _run(quantized, 1)
    tp_tokens, tp_logprobs = _run(quantized, 2)
    assert tp_tokens == tokens
    torch.testing.assert_close(tp_logprobs, logprobs, atol=1e-3, rtol=0)


def test_tp2_fp8_at_load_quantizes_each_ranks_experts():
    """quantization="fp8" on an unquantized MoE checkpoint: each rank quantizes its own
    experts' slices in 128-blocks (the blocks one rank makes); the attention's row-parallel
    linears scale activations over their own columns, so logprobs are close, not equal."""
    _, reference = fp8_moe_pair(wide=True)
    _, logprobs = _run(reference, 1, quantization="fp8")
    _, tp_logprobs = _run(reference, 2, quantization="fp8")
    torch.testing.assert_close(tp_logprobs, logprobs, atol=0.05, rtol=0)
    _, tp_plain = _run(reference, 2)
    assert (tp_plain - tp_logprobs).abs().max().item() > 1e-3  # the ranks did quantize


def test_each_rank_holds_its_experts_blocks():
    """In one process: rank r's FP8 experts are rows r of each expert's gate and up blocks
    and columns r of its down blocks, scales included."""
    from compiled_llm.quantization.moe_fp8 import Fp8FusedMoE

    quantized, _ = fp8_moe_pair(wide=True)
    whole = load_model(quantized, torch.float32, CPU, 64)
    full = next(m for m in whole.modules() if isinstance(m, Fp8FusedMoE))
    inter = full.intermediate_size // 2
    for rank in (0, 1):
        shard = load_model(quantized, torch.float32, CPU, 64,
                           tp=TPGroup(rank, 2, "unused", None, None))
        mine = next(m for m in shard.modules() if isinstance(m, Fp8FusedMoE))
        rows = [*range(rank * inter, (rank + 1) * inter),
                *range(2 * inter + rank * inter, 2 * inter + (rank + 1) * inter)]
        assert torch.equal(mine.w13_weight.float(), full.w13_weight.float()[:, rows])
        assert torch.equal(mine.w13_weight_scale_inv, full.w13_weight_scale_inv[:, [
            r // 128 for r in rows[::128]]])
        cols = slice(rank * inter, (rank + 1) * inter)
        assert torch.equal(mine.w2_weight.float(), full.w2_weight.float()[:, :, cols])
        assert torch.equal(mine.w2_weight_scale_inv, full.w2_weight_scale_inv[
            :, :, rank * inter // 128:(rank + 1) * inter // 128])


@pytest.mark.parametrize(("kind", "message"), [
    ("gptq", r"tensor_parallel_size 2 .*model\.layers\.0\.self_attn\.o_proj: gptq checkpoint: "
             "in_features=64 is not a multiple of quantization_config group_size=128"),
])
def test_splits_the_format_cannot_follow_are_refused_before_ranks_start(kind, message):
    """hidden 128 over 2 ranks: o_proj's 64 inputs a rank are half a 128-group; act order
    with split inputs. Refused with the field named, before any worker starts."""
    quantized, _ = packed_pair(kind, wide=kind == "gptq_act_order")
    with pytest.raises(ValueError, match=message):
        LLM(str(quantized), tensor_parallel_size=2, **BASE)


@pytest.mark.parametrize(("wide", "kwargs", "message"), [
    (False, {}, r"tensor_parallel_size 2 \(a rank's share of each expert\): block-FP8 experts "
                "need moe_intermediate_size a multiple of 128, got 64"),
])
def test_expert_splits_fp8_blocks_cannot_follow_are_refused(wide, kwargs, message):
    """Block-FP8 experts split only at 128-blocks of their intermediate features: refused
    with the field named, before any worker starts."""
    quantized, _ = fp8_moe_pair(wide=wide)
    with pytest.raises(ValueError, match=message):
        LLM(str(quantized), tensor_parallel_size=2, **BASE, **kwargs)


def test_expert_parallel_block_fp8_experts_equal_tp1():
    """enable_expert_parallel over a block-FP8 checkpoint: each rank's whole experts keep
    their weights and scales (and the dispatch the format's swap would drop): TP=1's tokens."""
    quantized, _ = fp8_moe_pair(wide=True)
    tokens, logprobs = _run(quantized, 1)
    ep_tokens, ep_logprobs = _run(quantized, 2, enable_expert_parallel=True)
    assert ep_tokens == tokens
    torch.testing.assert_close(ep_logprobs, logprobs, atol=1e-3, rtol=0)


def test_expert_parallel_fp8_at_load_keeps_each_ranks_experts():
    """quantization="fp8" with enable_expert_parallel: rank r's experts are quantized in
    place of its bf16 ones, still dispatched (in one process: no collective runs)."""
    from compiled_llm.distributed.expert_parallel import ExpertParallel
    from compiled_llm.quantization.moe_fp8 import Fp8FusedMoE

    _, reference = fp8_moe_pair(wide=True)
    whole = load_model(reference, torch.float32, CPU, 64, quantization="fp8")
    full = next(m for m in whole.modules() if isinstance(m, Fp8FusedMoE))
    shard = load_model(reference, torch.float32, CPU, 64, quantization="fp8",
                       tp=TPGroup(1, 2, "unused", None, None), expert_parallel=True)
    mine = next(m for m in shard.modules() if isinstance(m, Fp8FusedMoE))
    assert isinstance(mine, ExpertParallel) and mine.dispatcher.expert_start == 2
    assert torch.equal(mine.w13_weight.float(), full.w13_weight.float()[2:])
    assert torch.equal(mine.w2_weight_scale_inv, full.w2_weight_scale_inv[2:])
