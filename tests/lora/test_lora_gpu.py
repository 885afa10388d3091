"""LoRA on the GPU: the Triton shrink/expand against the torch reference at Llama-3-8B widths
(bf16), captured and replayed in a CUDA graph with new slots each replay, and an engine with
LoRA on and CUDA graphs (full and piecewise) giving the eager engine's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.lora.ops import lora_delta, lora_delta_reference
from tests.lora.kernel_inputs import lora_inputs, step_meta

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _check(out, ref):
    # a step of base-model rows only has a zero delta: relative to at least 1
    err = ((out.float() - ref.float()).norm() / max(ref.float().norm().item(), 1.0)).item()
    assert err < 2e-2, err


def _reference(x, lora_a, lora_b, slots, ends):
    return lora_delta_reference(x.float(), lora_a.float(), lora_b.float(), slots, ends)


@pytest.mark.parametrize(("tokens", "k", "widths"), [
    (1, 4096, [4096, 1024, 1024]), (64, 4096, [14336, 14336]), (512, 14336, [4096])])
def test_kernel_matches_reference_bf16(tokens, k, widths):
    x, lora_a, lora_b, slots, ends = lora_inputs(tokens, 4, 16, k, widths, torch.bfloat16,
                                                 seed=tokens + 1, device="cuda")
    out = lora_delta(x, lora_a, lora_b, step_meta(slots, 4, 1024), ends)
    _check(out, _reference(x, lora_a, lora_b, slots, ends))


def test_kernel_replays_in_a_cuda_graph_with_new_slots():
    x, lora_a, lora_b, slots, ends = lora_inputs(64, 4, 16, 1024, [2048, 512], torch.bfloat16,
                                                 device="cuda")
    meta = step_meta(slots, 4, 64)
    lora_delta(x, lora_a, lora_b, meta, ends)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lora_delta(x, lora_a, lora_b, meta, ends)
    new_slots = slots.roll(7).clone()
    new_slots[:5] = -1
    meta.copy_(step_meta(new_slots, 4, 64))
    graph.replay()
    _check(out, _reference(x, lora_a, lora_b, new_slots, ends))


def test_engine_with_cuda_graphs_matches_eager():
    from compiled_llm import LLM, LoRARequest, SamplingParams
    from tests.lora.helpers import make_adapter
    from tests.utils import make_checkpoint

    base = make_checkpoint("llama")
    loras = [LoRARequest("a", 1, str(make_adapter(base, 1))), None,
             LoRARequest("b", 2, str(make_adapter(base, 2, rank=4)))]
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (6, 30, 11)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        with LLM(str(base), enable_lora=True, max_loras=2, dtype="float32",
                 enforce_eager=eager, engine_core_process=False) as llm:
            got = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
            outs[eager] = [list(o.outputs[0].token_ids) for o in got]
            if not eager:
                assert llm.engine.executor.worker.runner.dispatcher.full_sizes
    assert outs[True] == outs[False]
