"""Shared experts overlapped with the routed ones: the load-time transform rebuilds Qwen2-MoE's
blocks over the side-stream op and the join; on the CPU both run sequentially and equal the
plain block, eager and traced fullgraph. On CUDA (gpu mark) the overlapped block equals the
plain one, also replayed from a CUDA graph."""

from __future__ import annotations

import copy

import pytest
import torch

from compiled_llm.worker.loader import load_model
from compiled_llm.worker.shared_overlap import overlap_shared_experts
from tests.utils import make_checkpoint

SPARSE_LAYER = 1  # tests/utils.py qwen2_moe: decoder_sparse_step 2


def _blocks(device: str, dtype=torch.float32):
    model = load_model(make_checkpoint("qwen2_moe"), dtype, torch.device(device), 128)
    plain = model.model.layers[SPARSE_LAYER].mlp
    overlapped = copy.deepcopy(model)
    assert overlap_shared_experts(overlapped) == 1  # one of the two layers is sparse
    return plain, overlapped.model.layers[SPARSE_LAYER].mlp


def test_overlapped_block_equals_plain_eager_and_traced():
    plain, overlapped = _blocks("cpu")
    assert type(overlapped).__name__ == "OverlappedSparseMoeBlock"
    # fullgraph through the ops' fake kernels (Inductor adds nothing here but minutes)
    compiled = torch.compile(overlapped, backend="aot_eager", fullgraph=True, dynamic=True)
    for num_tokens in (5, 17):
        hidden = torch.randn(num_tokens, 64)
        torch.testing.assert_close(overlapped(hidden), plain(hidden), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled(hidden), plain(hidden), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_stream_block_equals_plain_in_a_cuda_graph():
    plain, overlapped = _blocks("cuda", torch.bfloat16)
    hidden = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    expected = plain(hidden)
    torch.testing.assert_close(overlapped(hidden), expected, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = overlapped(hidden)
    fresh = torch.randn_like(hidden)
    hidden.copy_(fresh)
    graph.replay()
    torch.testing.assert_close(out, plain(fresh), atol=2e-2, rtol=2e-2)
