"""HorizontalGemmFusionPass with the fused weight layout: q/k/v and gate/up become one matmul
each over the one fused parameter (no per-step concatenation), and tokens do not change."""

from __future__ import annotations

import json
import re

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.passes import PassConfig
from compiled_llm.worker.fuse_weights import RowSliceLinear
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import capture_model
from tests.utils import make_checkpoint

LAYERS = 2  # tests/utils.py SMALL
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5, 9, 2, 7, 11, 3]}, {"prompt_token_ids": [4, 1, 8]}]
# a matmul in Inductor's CPU output code, capturing its weight operand (the last one)
GEMM = re.compile(r"extern_kernels\.(?:mm|addmm)\((?:.*), (reinterpret_tensor\(\w+|\w+), ")


def _model(name: str, quantization: str | None = None):
    return load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512,
                      quantization=quantization)


def test_loader_lays_siblings_out_as_views_of_one_parameter():
    model = _model("llama")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    names = {name for name, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj_weight" in names
    assert not any(name.endswith("q_proj.weight") for name in names)
    base = attn.qkv_proj_weight
    ptrs = [getattr(attn, n).weight.data_ptr() for n in ("q_proj", "k_proj", "v_proj")]
    row = base.stride(0) * base.element_size()
    assert ptrs == [base.data_ptr(), base.data_ptr() + 64 * row, base.data_ptr() + 96 * row]
    assert isinstance(mlp.up_proj, RowSliceLinear) and mlp.gate_up_proj_weight.shape == (256, 64)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_capture_fuses_each_layer_to_two_gemms(name):
    ref, out, before, after, m = capture_model(_model(name), 10, PassConfig(inline_fused_ops=False))
    gemms = lambda c: c["aten.mm"] + c["aten.addmm"]  # noqa: E731
    assert gemms(before) == 7 * LAYERS and gemms(after) == 4 * LAYERS
    assert m.matches("HorizontalGemmFusionPass") == 2 * LAYERS
    assert after["aten.cat"] == before["aten.cat"]  # RoPE's only: no weight is concatenated
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fp8_siblings_share_one_fp8_weight_and_its_scales():
    model = _model("qwen3", "fp8")
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj_weight.dtype == torch.float8_e4m3fn
    assert attn.qkv_proj_weight_scale.shape == (attn.qkv_proj_weight.shape[0], 1)
    rows_q = attn.q_proj.out_features
    assert attn.k_proj.weight_scale.data_ptr() == attn.qkv_proj_weight_scale[rows_q:].data_ptr()
    ref, out, before, after, m = capture_model(model, 10, PassConfig(inline_fused_ops=False))
    assert m.matches("HorizontalGemmFusionPass") == 2 * LAYERS
    assert before["compiled_llm.fp8_gemm"] == 7 * LAYERS
    assert after["compiled_llm.fp8_gemm"] == 4 * LAYERS
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def _tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def _piece_gemms(dump) -> list[list[str]]:
    """Per compiled piece, the weight operand of each matmul in Inductor's output code."""
    dirs = [dump / e["dir"] for e in json.loads((dump / "pieces.json").read_text())]
    return [GEMM.findall((d / "inductor_output_code_0.py").read_text()) for d in dirs]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_layer_piece_seven_gemms_to_four_same_tokens(name, tmp_path):
    ckpt = str(make_checkpoint(name))
    kw = dict(dtype="float32", enforce_eager=False, compile_mode="backend",
              engine_core_process=False)
    plain = {"enable_small_m_gemm": False}  # on a GPU: the matmuls stay aten.mm, as counted
    off = LLM(ckpt, **kw, compile_cache_dir=str(tmp_path / "c0"), dump_dir=str(tmp_path / "d0"),
              passes={"enable_horizontal_gemm": False, **plain})
    on = LLM(ckpt, **kw, compile_cache_dir=str(tmp_path / "c1"), dump_dir=str(tmp_path / "d1"),
             passes=plain)
    assert _tokens(on) == _tokens(off)
    # pieces: layer 0's q/k/v, then a whole decoder layer (o, gate, up, down, q, k, v), the rest
    assert [len(g) for g in _piece_gemms(tmp_path / "d0")] == [3, 7, 4]
    fused = _piece_gemms(tmp_path / "d1")
    assert [len(g) for g in fused] == [1, 4, 3]
    # every weight operand is a graph input (a parameter) read in place, never a buffer that a
    # kernel filled this step: the fused weights are not concatenated per step
    assert all(w.startswith("reinterpret_tensor(arg") for g in fused for w in g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_gpu_fused_layer_same_tokens(quantization, tmp_path):
    # CUDA graphs, Triton attention reading q/k/v as column views of the one qkv output
    ckpt = str(make_checkpoint("qwen3"))
    kw = dict(dtype="float32", engine_core_process=False, quantization=quantization)
    off = LLM(ckpt, **kw, compile_cache_dir=str(tmp_path / "c0"),
              passes={"enable_horizontal_gemm": False})
    on = LLM(ckpt, **kw, compile_cache_dir=str(tmp_path / "c1"))
    assert _tokens(on) == _tokens(off)
