"""The tinygemm small-M path of W4A16: our (qweight, scales, zeros) converted to tinygemm's
scales_and_zeros and run through torch's CPU tinygemm ops against w4a16_reference (asymmetric
zeros, every group size, fused row views), the token-count threshold, and on the GPU the CUDA
kernel, the op's selected path and a bf16 engine decoding on it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from compiled_llm.quantization import tinygemm, w4a16
from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.packing import pack_int4, unpack_int4
from compiled_llm.quantization.w4a16 import W4A16Linear, w4a16_gemm, w4a16_reference
from compiled_llm.worker.fuse_weights import fuse_group

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _random_w4(n: int, k: int, group: int, seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.002).bfloat16()
    zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
    return (pack_int4(values).to(device), scales.to(device), zeros.to(device))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


def _cpu_tinygemm(x, qweight, scales_zeros, group):
    """torch's CPU tinygemm over our qweight (its own packing; the same scales_and_zeros)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_int4(qweight).int(), 2)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, packed, group, scales_zeros.transpose(0, 1).contiguous())


@pytest.mark.parametrize("group", tinygemm.GROUP_SIZES)
def test_scales_zeros_match_reference_through_cpu_tinygemm(group):
    qweight, scales, zeros = _random_w4(48, 512, group, seed=group)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    scales_zeros = tinygemm.tinygemm_scales_zeros(scales, zeros)
    assert scales_zeros.shape == (48, 512 // group, 2)
    assert scales_zeros.transpose(0, 1).is_contiguous()  # tinygemm's [K/group, N, 2]
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, group)
    assert _rel_err(_cpu_tinygemm(x, qweight, scales_zeros, group), ref) < 1e-2


def test_uint8_layout_puts_even_inputs_in_the_high_nibble():
    values = torch.randint(0, 16, (8, 32), dtype=torch.uint8)
    packed = tinygemm.tinygemm_uint8(pack_int4(values))
    assert packed.shape == (8, 16) and packed.dtype == torch.uint8
    assert torch.equal(packed >> 4, values[:, 0::2]) and torch.equal(packed & 15, values[:, 1::2])


def _fused_attention(group: int, rows=(32, 16, 16), k: int = 256):
    parent = nn.Module()
    for i, (name, n) in enumerate(zip(("q_proj", "k_proj", "v_proj"), rows)):
        setattr(parent, name, W4A16Linear(*_random_w4(n, k, group, seed=i), None, None, group))
    assert fuse_group(parent, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
    return parent


def test_fused_row_views_read_their_rows_of_the_parents_tinygemm_tensors(monkeypatch):
    # the CPU op's packing stands in for the CUDA one: both keep a weight row per N row here
    monkeypatch.setattr(tinygemm, "pack_tinygemm", lambda q: q)
    parent = _fused_attention(64)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert w4a16._prepare_child(parent, getattr(parent, name)) == 1
    assert parent.qkv_proj_tinygemm_weight is parent.qkv_proj_qweight
    x = torch.randn(2, 256).bfloat16()
    for name in ("q_proj", "k_proj", "v_proj"):
        lin = getattr(parent, name)
        weight, scales_zeros = lin._tinygemm_rows()
        assert scales_zeros.shape == (lin.out_features, 4, 2)
        ref = w4a16_reference(x.float(), lin.tensor("qweight"), lin.tensor("scales").float(),
                              lin.tensor("zeros"), None, None, 64)
        assert _rel_err(_cpu_tinygemm(x, weight, scales_zeros, 64), ref) < 1e-2


def test_layers_that_do_not_qualify_keep_the_triton_path(monkeypatch):
    monkeypatch.setattr(tinygemm, "pack_tinygemm", lambda q: q)
    parent = _fused_attention(128, rows=(32, 12, 20))  # k: 12 rows, v: from row 44
    assert w4a16._prepare_child(parent, parent.q_proj) == 1
    assert w4a16._prepare_child(parent, parent.k_proj) == 0
    assert parent.k_proj._tinygemm_rows() == (None, None)
    assert w4a16._prepare_child(parent, parent.v_proj) == 0
    assert not tinygemm.tinygemm_qualifies(64, 4096, 128, torch.float16)  # bf16 scales only
    assert not tinygemm.tinygemm_qualifies(64, 4096, 16, torch.bfloat16)  # group size
    assert not tinygemm.tinygemm_qualifies(64, 4160, 64, torch.bfloat16)  # K % 128
    assert tinygemm.tinygemm_qualifies(6144, 14336, 128, torch.bfloat16)
    cpu = W4A16Linear(*_random_w4(32, 256, 128, seed=0), None, None, 128)
    model = nn.Sequential(cpu)
    assert w4a16.prepare_tinygemm(model) == 0 and cpu.tinygemm_weight is None  # CPU


def test_threshold_env_then_files_then_default(tmp_path, monkeypatch):
    monkeypatch.delenv(w4a16_tuning.TINYGEMM_ENV, raising=False)
    path = tmp_path / "w4a16.json"
    path.write_text(json.dumps({"devices": {}, "tinygemm_max_rows": {"GPU X": 4}}))
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, str(path))
    assert w4a16_tuning.tinygemm_max_rows("GPU X") == 4
    assert w4a16_tuning.tinygemm_max_rows("GPU Y") == w4a16_tuning.DEFAULT_TINYGEMM_MAX_ROWS
    monkeypatch.delenv(w4a16_tuning.CONFIG_ENV)
    assert w4a16_tuning.tinygemm_max_rows("NVIDIA H200") == 4  # the shipped, measured entry
    monkeypatch.setenv(w4a16_tuning.TINYGEMM_ENV, "0")
    assert w4a16_tuning.tinygemm_max_rows("GPU X") == 0
    monkeypatch.setenv(w4a16_tuning.TINYGEMM_ENV, "many")
    with pytest.raises(ValueError, match=w4a16_tuning.TINYGEMM_ENV):
        w4a16_tuning.tinygemm_max_rows("GPU X")


def test_horizontal_fusion_keeps_the_tinygemm_tensors_whole(monkeypatch):
    from compiled_llm.passes import PassConfig
    from compiled_llm.worker.loader import load_model
    from tests.passes.helpers import capture_model
    from tests.quantization.packers import LLAMA, packed_pair

    model = load_model(packed_pair("gptq_act_order")[0], torch.float32, torch.device("cpu"), 512)
    monkeypatch.setattr(tinygemm, "pack_tinygemm", lambda q: q.clone())
    monkeypatch.setattr(tinygemm, "tinygemm_qualifies", lambda *args: True)  # float32 here
    for parent in model.modules():
        for child in parent.children():
            if isinstance(child, W4A16Linear):
                assert w4a16._prepare_child(parent, child) == 1
    ref, out, before, after, manager = capture_model(model, 10,
                                                     PassConfig(inline_fused_ops=False))
    layers, op = LLAMA["num_hidden_layers"], "compiled_llm.w4a16_gemm"
    assert before[op] == 7 * layers and after[op] == 4 * layers  # the 9-argument op fuses
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])
@pytest.mark.gpu
@needs_cuda
def test_cuda_tinygemm_and_the_selected_path_match_reference(m, n, k, monkeypatch):
    qweight, scales, zeros = _random_w4(n, k, 128, seed=m, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(k, device="cuda") if m == 4 else None
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, perm, None, 128)
    packed = tinygemm.pack_tinygemm(qweight)
    scales_zeros = tinygemm.tinygemm_scales_zeros(scales, zeros)
    x_in = x if perm is None else x.index_select(1, perm)
    assert _rel_err(tinygemm.tinygemm_mm(x_in, packed, scales_zeros, 128), ref) < 1e-2
    monkeypatch.setenv(w4a16_tuning.TINYGEMM_ENV, "16")
    assert w4a16_tuning.use_tinygemm(x)
    out = w4a16_gemm(x, qweight, scales, zeros, perm, None, 128, packed, scales_zeros)
    assert _rel_err(out, ref) < 1e-2
    rows = packed.narrow(0, 1024, 2048)  # a row view of a fused weight: tiles 128..383
    assert torch.equal(rows, tinygemm.pack_tinygemm(qweight.narrow(0, 1024, 2048)))


def test_prefill_sizes_choose_dequantize_then_matmul(monkeypatch):
    rows = torch.zeros(w4a16_tuning.DEFAULT_DEQUANT_MIN_ROWS, 8)
    assert w4a16_tuning.use_dequant_mm(rows) and not w4a16_tuning.use_dequant_mm(rows[1:])
    monkeypatch.setenv(w4a16_tuning.DEQUANT_ENV, "0")
    assert not w4a16_tuning.use_dequant_mm(rows)
    monkeypatch.setenv(w4a16_tuning.DEQUANT_ENV, "many")
    with pytest.raises(ValueError, match=w4a16_tuning.DEQUANT_ENV):
        w4a16_tuning.use_dequant_mm(rows)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [256, 1000])
def test_cuda_dequantize_then_matmul_matches_reference(m):
    qweight, scales, zeros = _random_w4(6144, 4096, 128, seed=m, device="cuda")
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    assert w4a16_tuning.use_dequant_mm(x)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, 128)
    assert _rel_err(w4a16_gemm(x, qweight, scales, zeros, None, None, 128), ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["gptq_act_order", "ct_W4A16"])
def test_bf16_engine_decodes_on_tinygemm_as_on_triton(kind, monkeypatch):
    from compiled_llm import LLM, SamplingParams
    from tests.quantization.packers import packed_pair
    from tests.utils import random_prompts

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    results = []
    for rows in ("16", "0"):  # tinygemm at decode, then Triton only
        monkeypatch.setenv(w4a16_tuning.TINYGEMM_ENV, rows)
        llm = LLM(str(packed_pair(kind)[0]), dtype="bfloat16", engine_core_process=False)
        attn = llm.engine.executor.worker.runner.model.model.layers[0].self_attn
        assert attn.qkv_proj_tinygemm_weight is not None
        prompts = random_prompts(3, llm.engine.model_config.vocab_size, seed=5)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results.append([(o.outputs[0].token_ids, [d[t].logprob for d, t in zip(
            o.outputs[0].logprobs, o.outputs[0].token_ids)]) for o in outs])
        del llm
    compared = 0
    for (tokens, logprobs), (triton_tokens, triton_logprobs) in zip(*results):
        same = next((i for i, (a, b) in enumerate(zip(tokens, triton_tokens)) if a != b),
                    len(tokens))  # bf16 rounding may flip a near tie: compare up to it
        torch.testing.assert_close(torch.tensor(logprobs[:same]),
                                   torch.tensor(triton_logprobs[:same]), atol=0.1, rtol=0.05)
        compared += same
    assert compared >= 6  # decode steps (3 rows: tinygemm) were compared
