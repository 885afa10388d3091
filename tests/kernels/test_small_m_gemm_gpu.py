"""The small-M GEMM on the GPU: the kernel in bfloat16 at the decode shapes (both variants,
split-K), split-K summed in one launch bit-equal to the two-kernel sum, the op taking a tuned
Triton entry inside a CUDA graph, and the pass putting the op in a compiled CUDA graph by
default; the gated op (SiLU·mul in the prologue) bit-equal to Inductor's SiLU·mul kernel then the
plain kernel at the Qwen3-0.6B and Llama-3-8B down shapes; the add + RMSNorm op against the
unfused path, and its pass in a compiled graph by default; the gate/up SiLU·mul op likewise."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from compiled_llm.gemm import SmallMConfig, arrival, small_m_mm, small_m_mm_silu_mul, tuning

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CONFIGS = [SmallMConfig(16, 256, 4), SmallMConfig(32, 512, 1, 8, 4),
           SmallMConfig(64, 256, 8, 4, 3, use_dot=True), SmallMConfig(32, 128, 2, 8, 2, True)]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize(("n", "k"), [(4096, 1024), (1024, 3072), (1000, 1000)])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_kernel_matches_mm_in_bf16(config, n, k, m):
    from compiled_llm.gemm.kernels import small_m_mm_triton

    if not config.use_dot and m > 4:
        pytest.skip("the CUDA-core variant is tuned up to 4 rows")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = small_m_mm_triton(x, weight, config)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert _rel_err(out, torch.mm(x.float(), weight.float().t())) < 1e-2


def _two_kernels(x: torch.Tensor, weight: torch.Tensor, config: SmallMConfig) -> torch.Tensor:
    """The split-K sum by a second kernel: no counters to count arrivals with."""
    from compiled_llm.gemm import kernels

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(arrival._COUNTERS, x.device, torch.zeros(0, dtype=torch.int32,
                                                                  device=x.device))
        return kernels.small_m_mm_triton(x, weight, config)


@pytest.mark.parametrize("config", [SmallMConfig(16, 128, 8), SmallMConfig(32, 128, 4, 4, 3, True)],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_split_k_in_one_launch_is_the_two_kernel_sum(config, dtype, monkeypatch):
    """The last program of a column block reads every other program's partial (release/acquire
    on its counter), launch after launch and replay after replay (new inputs each time, so a
    stale partial shows); the counters end at zero."""
    from compiled_llm.gemm import kernels

    monkeypatch.setattr(arrival, "ONE_LAUNCH", True)  # opt-in: COMPILED_LLM_ONE_LAUNCH_SPLITS=1
    x = torch.randn(4, 4096, device="cuda", dtype=dtype)
    weight = torch.randn(8192, 4096, device="cuda", dtype=dtype) / 64
    for _ in range(20):
        x.copy_(torch.randn_like(x))
        assert torch.equal(kernels.small_m_mm_triton(x, weight, config),
                           _two_kernels(x, weight, config))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.small_m_mm_triton(x, weight, config)
    for _ in range(20):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, _two_kernels(x, weight, config))
    assert not kernels.split_counters(x.device).any()


def test_op_takes_the_tuned_entry_in_a_cuda_graph(tmp_path, monkeypatch):
    cfg = SmallMConfig(32, 256, 4)
    gpu = torch.cuda.get_device_name()
    path = tmp_path / "small_m.json"
    entry = {"2": dataclasses.asdict(cfg), "16": "cublas"}
    path.write_text(json.dumps({"devices": {gpu: {"2048,1024": entry}}}))
    monkeypatch.setenv(tuning.CONFIG_ENV, str(path))
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    assert tuning.tuned_config(x, weight) == cfg
    small_m_mm(x, weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = small_m_mm(x, weight)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert _rel_err(out, torch.mm(x.float(), weight.float().t())) < 1e-2
    assert tuning.tuned_config(x[:1].contiguous().expand(8, -1), weight) is None  # M=8: cuBLAS


def test_pass_rewrites_cuda_graphs_by_default():
    from compiled_llm.passes import PassConfig
    from tests.passes.helpers import compile_run

    linear = torch.nn.Linear(256, 512, bias=False, device="cuda", dtype=torch.bfloat16)
    linear.requires_grad_(False)
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    out, code, manager = compile_run(linear, (x,), PassConfig())
    assert manager.matches("SmallMGemmPass") == 1 and "small_m_mm" in code
    assert _rel_err(out, torch.mm(x.float(), linear.weight.float().t())) < 1e-2


@pytest.mark.parametrize("config", [SmallMConfig(32, 256, 4, 4, 3, True), SmallMConfig(16, 256, 4),
                                    SmallMConfig(64, 128, 1, 4, 3, True)], ids=str)
@pytest.mark.parametrize(("n", "k"), [(1024, 3072), (4096, 14336)])  # Qwen3-0.6B, Llama-3-8B
@pytest.mark.parametrize("m", [1, 4, 16])
def test_gated_kernel_is_silu_and_mul_then_small_m_mm(config, n, k, m):
    """Bit-equal to the unfused compiled path (Inductor's silu_and_mul kernel, then the same
    small-M kernel), close to eager silu * up then mm."""
    from compiled_llm.gemm.kernels import small_m_mm_silu_mul_triton, small_m_mm_triton
    from compiled_llm.passes import ops

    if not config.use_dot and m > 4:
        pytest.skip("the CUDA-core variant is tuned up to 4 rows")
    gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16) * 2
    gate, up = gate_up.chunk(2, dim=-1)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = small_m_mm_silu_mul_triton(gate, up, weight, config)
    act = torch.compile(ops.silu_and_mul_ref, dynamic=False)(gate, up)
    assert torch.equal(out, small_m_mm_triton(act, weight, config))
    eager = torch.mm((torch.nn.functional.silu(gate) * up).float(), weight.float().t())
    assert _rel_err(out, eager) < 1e-2


@pytest.mark.parametrize(("n", "k"), [(1024, 3072), (4096, 14336)])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_gated_op_matches_silu_and_mul_then_small_m_mm(n, k, m):
    """The op with the shipped table (Triton for Qwen3-0.6B's down, cuBLAS for Llama-3-8B's)."""
    from compiled_llm.passes import ops

    gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
    gate, up = gate_up.chunk(2, dim=-1)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = small_m_mm_silu_mul(gate, up, weight)
    ref = small_m_mm(ops.silu_and_mul(gate, up), weight)
    assert out.shape == (m, n) and _rel_err(out, ref.float()) < 1e-2


@pytest.mark.parametrize(("n", "k"), [(1024, 2048), (1024, 3072), (4096, 4096)])  # o, down, 8B o
@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_add_rms_norm_op_is_the_unfused_path(n, k, m):
    """The op with the shipped table (split-K Triton up to 16 rows, cuBLAS at 40): summed
    bit-equal to small_m_mm then the add, normed to Inductor's add + norm kernel within bf16's
    rounding; the same inside a CUDA graph with new inputs."""
    from compiled_llm.gemm import small_m_mm_add_rms_norm
    from compiled_llm.passes import ops

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    norm_weight = 1 + 0.1 * torch.randn(n, device="cuda", dtype=torch.bfloat16)
    inductor = torch.compile(ops.fused_add_rms_norm_ref, dynamic=False)

    def check(normed, summed):
        ref_normed, ref_summed = inductor(small_m_mm(x, weight), residual, norm_weight, 1e-6)
        assert torch.equal(summed, ref_summed)
        torch.testing.assert_close(normed, ref_normed, rtol=1.6e-2, atol=1e-2)

    check(*small_m_mm_add_rms_norm(x, weight, residual, norm_weight, 1e-6))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, summed = small_m_mm_add_rms_norm(x, weight, residual, norm_weight, 1e-6)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(residual))
        graph.replay()
        check(normed, summed)


def test_add_rms_norm_pass_rewrites_split_k_sites_by_default():
    from compiled_llm.passes import PassConfig
    from models.layers import rms_norm
    from tests.passes.helpers import compile_run

    def proj_add_norm(x, w_o, residual, norm_weight):
        summed = x @ w_o.t() + residual
        return rms_norm(summed, norm_weight, 1e-6), summed

    args = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
            for shape in ((2, 2048), (1024, 2048), (2, 1024), (1024,))]
    out, code, manager = compile_run(proj_add_norm, args, PassConfig())
    assert manager.matches("SmallMGemmAddRMSNormFusionPass") == 1
    assert "small_m_mm_add_rms_norm" in code
    for got, ref in zip(out, proj_add_norm(*args)):
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=0.1)


@pytest.mark.parametrize(("n", "k"), [(6144, 1024), (28672, 4096)])  # Qwen3-0.6B, Llama-3-8B
@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_gate_up_silu_mul_op_is_the_product_then_silu_mul(n, k, m):
    """The op with the shipped table (the GATE_UP epilogue where Triton has no split-K, else
    the product then one SiLU·mul kernel) against small_m_mm then Inductor's SiLU·mul, in a
    CUDA graph too."""
    from compiled_llm.gemm import small_m_gate_up_silu_mul
    from compiled_llm.passes import ops

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    inductor = torch.compile(ops.silu_and_mul_ref, dynamic=False)

    def check(out):
        gate, up = small_m_mm(x, weight).chunk(2, dim=-1)
        torch.testing.assert_close(out, inductor(gate, up), rtol=1.6e-2, atol=1e-2)

    check(small_m_gate_up_silu_mul(x, weight))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = small_m_gate_up_silu_mul(x, weight)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        check(out)
