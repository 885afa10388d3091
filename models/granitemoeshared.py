"""Granite MoE with a shared MLP (GraniteMoeSharedForCausalLM): GraniteMoe's layer whose
sparse block adds an ungated shared MLP (shared_intermediate_size wide; none at 0) to the routed
experts before Granite's residual_multiplier. The checkpoint's shared_mlp.input_linear (gate
rows, then up rows) and output_linear load as its gate_up_proj and down_proj."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.granite import GraniteConfig
from compiled_llm.models.granitemoe import (
    GraniteMoeDecoderLayer,
    GraniteMoeForCausalLM,
    GraniteMoeModel,
)
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.moe import SparseMoeBlock
from compiled_llm.models.phi3 import Phi3MLP


@dataclasses.dataclass
class GraniteMoeSharedConfig(GraniteConfig):
    """GraniteConfig whose moe.shared_expert_intermediate_size is shared_intermediate_size."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GraniteMoeSharedConfig:
        """GraniteConfig.from_hf, the shared MLP's width read from shared_intermediate_size."""
        shared = hf_config.get("shared_intermediate_size", 0) or 0
        return super().from_hf({**hf_config, "shared_expert_intermediate_size": shared},
                               **defaults)


class GraniteMoeSharedBlock(SparseMoeBlock):
    """SparseMoeBlock (softmax top-k) plus an ungated shared MLP with one gate_up_proj."""

    def __init__(self, cfg: GraniteMoeSharedConfig) -> None:
        shared = cfg.moe.shared_expert_intermediate_size
        routed = dataclasses.replace(cfg.moe, shared_expert_intermediate_size=0)
        super().__init__(dataclasses.replace(cfg, moe=routed))
        if shared:
            self.shared_expert = Phi3MLP(dataclasses.replace(cfg, intermediate_size=shared))

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)


class GraniteMoeSharedDecoderLayer(GraniteMoeDecoderLayer):
    """GraniteMoe's layer over a GraniteMoeSharedBlock (built once: not the Llama layer's
    block first)."""

    def __init__(self, cfg: GraniteMoeSharedConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = GraniteMoeSharedBlock(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_multiplier = cfg.residual_multiplier


class GraniteMoeSharedModel(GraniteMoeModel):
    """The Granite model over GraniteMoeShared layers."""

    layer_cls = GraniteMoeSharedDecoderLayer


class GraniteMoeSharedForCausalLM(GraniteMoeForCausalLM):
    """GraniteMoeShared for causal LM: GraniteMoe's contract (tensor parallelism as
    GraniteMoe's, the shared MLP split as a dense one) over GraniteMoeSharedModel."""

    model_cls = GraniteMoeSharedModel
    config_cls = GraniteMoeSharedConfig
    renamed_modules = {**GraniteMoeForCausalLM.renamed_modules,
                       ".shared_mlp.input_linear.": ".mlp.shared_expert.gate_up_proj.",
                       ".shared_mlp.output_linear.": ".mlp.shared_expert.down_proj."}
