"""compiled_llm::fused_moe on CPU: the reference equals the per-token contract, its fake kernel
gives the shape, it compiles fullgraph with a dynamic token count (no split, no graph break),
and bad shapes are a ValueError naming the input."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.compile import counters
from compiled_llm.moe import fused_moe, fused_moe_reference
from tests.moe.helpers import moe_inputs, per_token_moe


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 4, 1), (7, 8, 2), (33, 6, 3)])
def test_reference_equals_per_token_loop(num_tokens, num_experts, top_k):
    args = moe_inputs(num_tokens, num_experts, top_k, 24, 40)
    out = fused_moe(*args)
    assert out.dtype == torch.float32 and out.shape == (num_tokens, 24)
    torch.testing.assert_close(out.double(), per_token_moe(*args), atol=1e-5, rtol=1e-5)


def test_reference_bf16_close_and_unused_experts_ignored():
    x, w13, w2, weights, ids = moe_inputs(9, 8, 2, 32, 16, dtype=torch.bfloat16)
    ids = ids % 3  # experts 3..7 get no token
    ids[:, 1] = (ids[:, 0] + 1) % 3
    out = fused_moe_reference(x, w13, w2, weights, ids)
    assert out.dtype == torch.bfloat16
    ref = per_token_moe(x, w13, w2, weights, ids)
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_fake_kernel_gives_the_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = [torch.empty(5, 16), torch.empty(4, 64, 16), torch.empty(4, 16, 32),
                torch.empty(5, 2), torch.empty(5, 2, dtype=torch.long)]
        out = torch.ops.compiled_llm.fused_moe(*args)
    assert out.shape == (5, 16) and out.dtype == torch.float32


def test_compiles_fullgraph_with_dynamic_tokens_and_no_split():
    from compiled_llm.compile.backend import BackendOptions, CompiledLLMBackend

    _, w13, w2, _, _ = moe_inputs(1, 4, 2, 16, 8)
    gate = torch.randn(4, 16)

    def block(x):  # the routing in plain torch, then the op, as the models write it
        weights, ids = torch.softmax(x @ gate.t(), -1).topk(2, -1)
        return fused_moe(x, w13, w2, weights / weights.sum(-1, keepdim=True), ids)

    counters.reset()
    compiled = torch.compile(block, backend=CompiledLLMBackend(BackendOptions()),
                             fullgraph=True, dynamic=True)
    for num_tokens in (3, 11, 2):
        x = torch.randn(num_tokens, 16)
        torch.testing.assert_close(compiled(x), block(x), atol=1e-5, rtol=1e-5)
    assert counters.graphs_captured == 1 and counters.recompiles == 0
    assert counters.pieces == 1  # the op is no split point
    assert counters.graph_breaks == 0


@pytest.mark.parametrize("change,match", [
    (lambda a: a.__setitem__(1, torch.empty(4, 63, 16)), "do not fit"),
    (lambda a: a.__setitem__(2, torch.empty(4, 16, 31)), "do not fit"),
    (lambda a: a.__setitem__(3, torch.empty(5, 3)), "topk_ids"),
    (lambda a: a.__setitem__(4, torch.empty(5, 2)), "integers"),
])
def test_bad_shapes_raise(change, match):
    args = [torch.randn(5, 16), torch.randn(4, 64, 16), torch.randn(4, 16, 32),
            torch.rand(5, 2), torch.zeros(5, 2, dtype=torch.long)]
    change(args)
    with pytest.raises(ValueError, match=match):
        fused_moe(*args)


def test_kernel_config_table_grows_tiles_with_tokens_per_expert():
    from compiled_llm.moe.triton_moe import check_triton_inputs, moe_gemm_config

    sizes = [moe_gemm_config(tokens, 8, 128, torch.bfloat16).block_m
             for tokens in (1, 512, 2048, 8192)]
    assert sizes == [16, 32, 64, 128]
    with pytest.raises(ValueError, match="w13, w2 of its dtype"):  # FP8 only with block scales
        check_triton_inputs(torch.empty(2, 16), torch.empty(4, 64, 16, dtype=torch.float8_e4m3fn),
                            torch.empty(4, 16, 32))
