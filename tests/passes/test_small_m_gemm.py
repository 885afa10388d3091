"""SmallMGemmPass: with it forced on the CPU, every bias-free weight matmul becomes
`compiled_llm::small_m_mm` (fused q/k/v and gate/up included), biased ones, activation-by-
activation ones, FP8 linears and static token counts past 16 stay, and outputs do not change; by
default on the CPU it matches nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import capture_model, capture_run, compile_run
from tests.utils import make_checkpoint

# the SiLU·mul and the add + norms stay out (test_silu_mul_small_m.py, test_small_m_silu_mul.py
# and test_small_m_add_rms_norm.py fold them in)
FORCED = PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                    enable_silu_mul_small_m=False, enable_small_m_silu_mul=False,
                    enable_small_m_add_rms_norm=False)
LAYERS = 2  # tests/utils.py SMALL


class Toy(nn.Module):
    """Two bias-free linears, a biased one, and a product of two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 48, bias=False)
        self.down = nn.Linear(48, 32, bias=False)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.down(torch.relu(self.up(x)))
        mixed = hidden @ (hidden * 2).t()  # [T, T]: no weight in it
        return self.head(hidden) + mixed.sum(-1, keepdim=True)


def _toy_run(config: PassConfig, tokens: int = 5, dynamic: bool = True):
    torch.manual_seed(0)
    model, x = Toy().requires_grad_(False), torch.randn(tokens, 32)
    out, before, after, manager = capture_run(model, (x,), config, dynamic=dynamic)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    return before, after, manager


def test_forced_pass_replaces_only_weight_mms():
    before, after, manager = _toy_run(FORCED)
    assert before["aten.mm"] == 3 and after["aten.mm"] == 1  # the activation product stays
    assert after["compiled_llm.small_m_mm"] == 2 and after["aten.addmm"] == before["aten.addmm"]
    assert manager.matches("SmallMGemmPass") == 2


def test_default_on_cpu_changes_nothing():
    before, after, manager = _toy_run(PassConfig(inline_fused_ops=False))
    assert after["compiled_llm.small_m_mm"] == 0 and after["aten.mm"] == before["aten.mm"]
    assert manager.matches("SmallMGemmPass") == 0


def test_static_token_count_past_16_stays_mm():
    _, after, _ = _toy_run(FORCED, tokens=32, dynamic=False)
    assert after["compiled_llm.small_m_mm"] == 0
    _, after, _ = _toy_run(FORCED, tokens=16, dynamic=False)
    assert after["compiled_llm.small_m_mm"] == 2


def test_through_inductor_the_op_is_called_and_matches():
    torch.manual_seed(0)
    model, x = Toy().requires_grad_(False), torch.randn(3, 32)
    out, code, manager = compile_run(model, (x,), PassConfig(small_m_gemm_on_cpu=True))
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert "compiled_llm.small_m_mm" in code and manager.matches("SmallMGemmPass") == 2


@pytest.mark.parametrize(("name", "per_layer"), [("llama", 4), ("qwen2", 3)])
def test_model_layers_fused_gemms_become_the_op(name, per_layer):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    ref, out, _, after, _ = capture_model(model, 10, FORCED)
    # llama: qkv, o, gate_up, down; qwen2's qkv has a bias (addmm) and stays
    assert after["compiled_llm.small_m_mm"] == per_layer * LAYERS
    assert after["aten.mm"] == 0 and after["aten.addmm"] == (4 - per_layer) * LAYERS
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_fp8_linears_are_not_matched():
    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512,
                       quantization="fp8")
    _, _, _, after, manager = capture_model(model, 10, FORCED)
    assert after["compiled_llm.fp8_gemm"] == 4 * LAYERS
    assert after["compiled_llm.small_m_mm"] == 0 and manager.matches("SmallMGemmPass") == 0
