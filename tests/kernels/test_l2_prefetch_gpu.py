"""The L2 weight prefetch on the GPU: the op launches (Hopper) inside a CUDA graph replayed many
times, changes no tensor and leaves the GEMM after it exact; it prefetches nothing past MAX_M
tokens or for a view that is not contiguous; an engine with the pass on and with it off gives
the same greedy tokens through CUDA graphs, the pool empty after."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from compiled_llm.gemm import l2_prefetch, small_m_mm
from compiled_llm.gemm.prefetch import prefetch_bytes
from tests.utils import make_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_prefetch_in_a_cuda_graph_changes_nothing():
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(4096, 4096, device="cuda", generator=gen).to(torch.bfloat16)
               for _ in range(3)]
    x = torch.randn(1, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    copies = [w.clone() for w in weights]
    expected = [small_m_mm(x, w) for w in weights]
    outs = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            l2_prefetch(w, x, 1.0)
            outs.append(small_m_mm(x, w))
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    for out, ref, w, copy in zip(outs, expected, weights, copies):
        assert torch.equal(out, ref) and torch.equal(w, copy)


def test_prefetch_bytes_limits():
    weight = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    expected = min(weight.nbytes, l2_bytes // 2) // 4096 * 4096 if hopper else 0
    assert prefetch_bytes(weight, 1, 0.5) == expected
    assert prefetch_bytes(weight, 17, 0.5) == 0  # past MAX_M tokens
    assert prefetch_bytes(weight[:, :100], 1, 0.5) == 0  # not contiguous


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise"])
def test_engine_greedy_tokens_equal_the_pass_off(monkeypatch, mode):
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")
    ckpt = str(make_checkpoint("llama"))
    prompts = [{"prompt_token_ids": [3 + i, 17, 5 * i + 1, 40, 2] * (i + 1)} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {}
    for enabled in (False, True):
        counters.reset()
        # the test flag prefetches the tiny model's weights too (below the size floor)
        passes = {"enable_l2_weight_prefetch": enabled, "l2_weight_prefetch_on_cpu": enabled}
        llm = LLM(ckpt, dtype="bfloat16", cudagraph_mode=mode, gpu_memory_utilization=0.3,
                  engine_core_process=False, passes=passes)
        runs[enabled] = [o.outputs[0].token_ids
                         for o in llm.generate(prompts, params, use_tqdm=False)]
        assert counters.pass_matches.get("L2WeightPrefetchPass", 0) == (2 if enabled else 0)
        assert llm.engine.num_used_blocks == 0
        del llm
    assert runs[True] == runs[False]
