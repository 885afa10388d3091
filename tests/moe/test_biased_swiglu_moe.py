"""compiled_llm::fused_moe with GPT-OSS's experts on CPU: per-expert biases and the swigluoai
activation against a per-token loop of HF's GptOssExperts math (its interleaved [E, H, 2I]
gate_up_proj layout), the FusedMoE module's optional biases, the fake kernel, ValueErrors for a
bad activation or bias shape. The Triton kernels: kernels/moe_bias_interpreted_cases.py."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.models.moe import FusedMoE
from compiled_llm.moe import GatedActivation, fused_moe, fused_moe_reference
from compiled_llm.moe.overlap import fused_moe_side_stream
from tests.moe.helpers import moe_inputs

GPT_OSS = {"activation": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def _biases(num_experts, hidden, inter, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_experts, 2 * inter, generator=gen),
            torch.randn(num_experts, hidden, generator=gen))


def _hf_layout(w13, w2, w13_bias):
    """Our stacked [W_gate; W_up] rows as HF's gate_up_proj [E, H, 2I] (gate, up interleaved
    by column), its bias [E, 2I] likewise, and down_proj [E, I, H]."""
    gate, up = w13.chunk(2, dim=1)
    gate_up = torch.stack([gate, up], dim=2).flatten(1, 2).transpose(1, 2)
    gate_b, up_b = w13_bias.chunk(2, dim=1)
    return gate_up, torch.stack([gate_b, up_b], dim=2).flatten(1), w2.transpose(1, 2)


def hf_gpt_oss_experts(x, w13, w2, w13_bias, w2_bias, weights, ids, activation="swigluoai",
                       alpha=1.702, limit=7.0):
    """GptOssExperts' math (transformers) one token and slot at a time, float32."""
    gate_up_proj, gate_up_bias, down_proj = _hf_layout(w13.float(), w2.float(), w13_bias.float())
    out = torch.zeros(x.shape, dtype=torch.float32)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[token, slot])
            gate_up = x[token].float() @ gate_up_proj[e] + gate_up_bias[e]
            gate, up = gate_up[::2], gate_up[1::2]
            if activation == "swigluoai":
                gate = gate.clamp(min=None, max=limit)
                up = up.clamp(min=-limit, max=limit)
                gated = (up + 1) * (gate * torch.sigmoid(gate * alpha))
            else:
                gated = torch.nn.functional.silu(gate) * up
            expert_out = gated @ down_proj[e] + w2_bias[e].float()
            out[token] += expert_out * weights[token, slot].float()
    return out


@pytest.mark.parametrize("activation,limit", [("swigluoai", 7.0), ("swigluoai", 0.5),
                                              ("silu", 7.0)])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 4, 1), (9, 8, 2), (21, 6, 4)])
def test_biased_experts_equal_hf_loop(activation, limit, num_tokens, num_experts, top_k):
    x, w13, w2, weights, ids = moe_inputs(num_tokens, num_experts, top_k, 24, 16, seed=top_k)
    x = x * 3  # gate and up past the limit on some rows
    w13_bias, w2_bias = _biases(num_experts, 24, 16)
    out = fused_moe(x, w13, w2, weights, ids, w13_bias, w2_bias, activation, 1.702, limit)
    ref = hf_gpt_oss_experts(x, w13, w2, w13_bias, w2_bias, weights, ids, activation, 1.702,
                             limit)
    assert out.dtype == torch.float32 and out.shape == (num_tokens, 24)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_swigluoai_without_biases_equals_zero_biases():
    x, w13, w2, weights, ids = moe_inputs(7, 4, 2, 16, 8, seed=3)
    zero13, zero2 = torch.zeros(4, 16), torch.zeros(4, 16)
    out = fused_moe(x, w13, w2, weights, ids, **GPT_OSS)
    ref = hf_gpt_oss_experts(x, w13, w2, zero13, zero2, weights, ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_defaults_are_the_five_argument_op():
    args = moe_inputs(5, 4, 2, 16, 8)
    plain = fused_moe(*args)
    torch.testing.assert_close(fused_moe(*args, None, None, "silu"), plain)
    torch.testing.assert_close(fused_moe_reference(*args, activation=GatedActivation()), plain)


def test_bf16_close_to_float32_loop():
    x, w13, w2, weights, ids = moe_inputs(9, 4, 2, 32, 16, dtype=torch.bfloat16, seed=2)
    w13_bias, w2_bias = (b.bfloat16() for b in _biases(4, 32, 16))
    out = fused_moe(x, w13, w2, weights, ids, w13_bias, w2_bias, **GPT_OSS)
    assert out.dtype == torch.bfloat16
    ref = hf_gpt_oss_experts(x, w13, w2, w13_bias, w2_bias, weights, ids)
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_fake_kernel_takes_the_new_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = [torch.empty(5, 16), torch.empty(4, 64, 16), torch.empty(4, 16, 32),
                torch.empty(5, 2), torch.empty(5, 2, dtype=torch.long),
                torch.empty(4, 64), torch.empty(4, 16)]
        out = torch.ops.compiled_llm.fused_moe(*args, activation="swigluoai")
    assert out.shape == (5, 16) and out.dtype == torch.float32


def test_bad_activation_is_a_value_error():
    args = moe_inputs(3, 4, 2, 16, 8)
    with pytest.raises(ValueError, match="activation"):
        fused_moe(*args, activation="gelu")
    with pytest.raises(ValueError, match="activation"):
        FusedMoE(4, 16, 8, activation="relu")


@pytest.mark.parametrize("which,shape", [("w13_bias", (4, 8)), ("w13_bias", (3, 16)),
                                         ("w2_bias", (4, 8)), ("w2_bias", (4, 16, 1))])
def test_bad_bias_shape_is_a_value_error(which, shape):
    args = moe_inputs(3, 4, 2, 16, 8)
    with pytest.raises(ValueError, match=which):
        fused_moe(*args, **{which: torch.zeros(shape)})


def test_side_stream_op_takes_the_same_arguments():
    x, w13, w2, weights, ids = moe_inputs(6, 4, 2, 16, 8, seed=4)
    w13_bias, w2_bias = _biases(4, 16, 8)
    extras = (w13_bias, w2_bias, "swigluoai", 1.702, 0.5)
    torch.testing.assert_close(fused_moe_side_stream(x, w13, w2, weights, ids, *extras),
                               fused_moe(x, w13, w2, weights, ids, *extras))


def test_fused_moe_module_biases_optional():
    plain = FusedMoE(4, 16, 8)
    assert set(plain.state_dict()) == {"w13_weight", "w2_weight"} and plain.plain_silu
    experts = FusedMoE(4, 16, 8, bias=True, activation="swigluoai", swiglu_limit=0.5)
    assert set(experts.state_dict()) == {"w13_weight", "w2_weight", "w13_bias", "w2_bias"}
    assert experts.w13_bias.shape == (4, 16) and experts.w2_bias.shape == (4, 16)
    x, w13, w2, weights, ids = moe_inputs(5, 4, 2, 16, 8, seed=6)
    w13_bias, w2_bias = _biases(4, 16, 8)
    experts.load_state_dict({"w13_weight": w13, "w2_weight": w2, "w13_bias": w13_bias,
                             "w2_bias": w2_bias})
    with torch.no_grad():
        out = experts(x, weights, ids)
    ref = hf_gpt_oss_experts(x, w13, w2, w13_bias, w2_bias, weights, ids, limit=0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert "swigluoai" in repr(experts)


def test_fp8_refuses_biased_experts():
    from compiled_llm.quantization.moe_fp8 import Fp8FusedMoE

    with pytest.raises(ValueError, match="without biases"):
        Fp8FusedMoE.from_dense(FusedMoE(2, 128, 128, bias=True, activation="swigluoai"))


def test_compiles_fullgraph_with_biases_and_swigluoai():
    # as the engine compiles (dynamic=False, T marked dynamic): alpha and limit stay constants
    from compiled_llm.compile import counters
    from compiled_llm.compile.backend import BackendOptions, CompiledLLMBackend

    experts = FusedMoE(4, 16, 8, bias=True, activation="swigluoai", swiglu_limit=0.5)
    for param in experts.parameters():
        torch.nn.init.normal_(param, std=0.3)
    experts.requires_grad_(False)
    gate = torch.randn(4, 16)

    def block(x):
        weights, ids = torch.softmax(x @ gate.t(), -1).topk(2, -1)
        return experts(x, weights, ids)

    counters.reset()
    compiled = torch.compile(block, backend=CompiledLLMBackend(BackendOptions()),
                             fullgraph=True, dynamic=False)
    for num_tokens in (3, 11, 2):
        x = torch.randn(num_tokens, 16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), block(x), atol=1e-5, rtol=1e-5)
    assert counters.graphs_captured == 1 and counters.recompiles == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("activation", ["swigluoai", "silu"])
@pytest.mark.parametrize("num_tokens", [1, 64, 1024])
def test_gpt_oss_shape_on_gpu(activation, num_tokens):
    # GPT-OSS's hidden and expert sizes (2880: not a multiple of the tiles), bf16, biased
    experts, top_k, size = 8, 4, 2880
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * std).bfloat16()

    x = randn(num_tokens, size)
    w13, w2 = randn(experts, 2 * size, size, std=0.03), randn(experts, size, size, std=0.03)
    w13_bias, w2_bias = randn(experts, 2 * size), randn(experts, size)
    weights, ids = torch.softmax(randn(num_tokens, experts).float(), -1).topk(top_k, -1)
    out = fused_moe(x, w13, w2, weights, ids, w13_bias, w2_bias, activation)
    ref = fused_moe_reference(x, w13, w2, weights, ids, w13_bias=w13_bias, w2_bias=w2_bias,
                              activation=GatedActivation(activation))
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-2, err
