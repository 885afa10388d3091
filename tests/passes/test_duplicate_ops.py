"""DuplicateOpEliminationPass: equal calls of `compiled_llm::lora_delta` become one node (a
different slice list stays apart); on a LoRA-wrapped tiny Llama each layer's seven projection
deltas become four (q/k/v and gate/up one each), outputs equal eager."""

from __future__ import annotations

import torch

from compiled_llm.lora.manager import LoRAManager, LoRASettings
from compiled_llm.lora.ops import lora_delta
from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.lora.kernel_inputs import lora_inputs, step_meta
from tests.passes.helpers import capture_model, capture_run
from tests.utils import make_checkpoint

OP = "compiled_llm.lora_delta"


def test_equal_calls_merge_and_others_stay():
    x, lora_a, lora_b, slots, ends = lora_inputs(9, 2, 16, 32, [16, 16], seed=1)
    meta = step_meta(slots, 2, 16)

    def fn(x, lora_a, lora_b, meta):
        first = lora_delta(x, lora_a, lora_b, meta, ends)[:, :16]
        second = lora_delta(x, lora_a, lora_b, meta, ends)[:, 16:]
        other = lora_delta(x, lora_a[:, :16], lora_b[:, :16], meta, [16])  # first member alone
        return first + second + other

    out, before, after, manager = capture_run(fn, (x, lora_a, lora_b, meta), PassConfig())
    assert before[OP] == 3 and after[OP] == 2
    assert manager.matches("DuplicateOpEliminationPass") == 1
    torch.testing.assert_close(out, fn(x, lora_a, lora_b, meta))


def test_lora_llama_computes_four_deltas_per_layer():
    model = load_model(make_checkpoint("llama"), torch.float32, torch.device("cpu"), 512)
    layers = model.config.num_hidden_layers
    lora = LoRAManager(model, LoRASettings(max_loras=2, max_lora_rank=8, max_cpu_loras=2), 64)
    gen = torch.Generator().manual_seed(0)
    for layer in lora.layers.values():  # slot 1 holds a random adapter
        layer.lora_a[1].copy_(torch.randn(layer.lora_a[1].shape, generator=gen) * 0.1)
        layer.lora_b[1].copy_(torch.randn(layer.lora_b[1].shape, generator=gen) * 0.1)
    slots = torch.tensor([1, -1, 1, 1, -1, 1, 1, 1, -1, 1])
    lora.meta.data.copy_(step_meta(slots, 2, 64))
    ref, out, before, after, manager = capture_model(model, 10, PassConfig())
    assert before[OP] == 7 * layers and after[OP] == 4 * layers
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
