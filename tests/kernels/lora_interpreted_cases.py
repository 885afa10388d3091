"""The Triton LoRA shrink/expand against the torch reference, run by test_interpreter.py in a
subprocess with TRITON_INTERPRET=1 (CPU tensors, small shapes). Not collected directly."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.lora.kernels import kernels_interpreted, lora_expand, lora_shrink
from compiled_llm.lora.ops import expand_block_n, lora_delta_reference
from tests.lora.kernel_inputs import lora_inputs, segments, step_meta

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("tokens", "slots", "k", "widths"), [
    (1, 1, 32, [48]), (19, 3, 40, [32, 16, 16]), (70, 4, 64, [64, 80])])
def test_matches_reference(dtype, tokens, slots, k, widths):
    x, lora_a, lora_b, token_slots, ends = lora_inputs(tokens, slots, 16, k, widths, dtype,
                                                       seed=tokens)
    sorted_tokens, seg_starts = segments(token_slots, slots)
    shrunk = lora_shrink(x, lora_a, sorted_tokens, seg_starts, members=len(ends), block_k=16,
                         split_k=2)
    out = lora_expand(shrunk, lora_b, sorted_tokens, seg_starts, ends, expand_block_n(ends))
    ref = lora_delta_reference(x.float(), lora_a.float(), lora_b.float(), token_slots, ends)
    scale = max(1.0, ref.abs().max().item())
    assert (out.float() - ref).abs().max().item() <= TOLERANCE[dtype] * scale
    assert not out[token_slots < 0].any()  # base-model tokens get no delta


def test_op_reads_the_step_buffer_the_pool_fills():
    from compiled_llm.lora.ops import _lora_delta_cuda

    x, lora_a, lora_b, token_slots, ends = lora_inputs(21, 3, 16, 32, [32, 16], seed=5)
    meta = step_meta(token_slots, 3, max_tokens=64)
    out = _lora_delta_cuda(x, lora_a, lora_b, meta, ends)  # the CUDA kernel's body, interpreted
    ref = lora_delta_reference(x, lora_a, lora_b, token_slots, ends)
    assert (out - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())
