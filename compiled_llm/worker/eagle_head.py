"""The EAGLE-1 draft head over a Llama-family target (the EAGLE repo's and vLLM's layout): fc
over concat(embed(token), target hidden), Llama decoder layers whose first has no
input_layernorm, no final norm; logits through the target's lm_head unless the checkpoint
brings one. The target hidden states arrive through a fixed buffer (`target_hidden`), so the
forward keeps the (input_ids, positions) contract that runners and CUDA graphs call."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.layers import RotaryEmbedding
from compiled_llm.models.llama import LlamaDecoderLayer


class EagleDecoderLayer(LlamaDecoderLayer):
    """A Llama decoder layer; layer 0 skips input_layernorm (EAGLE normalises neither the
    fc output nor, therefore, the residual stream it starts)."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        if layer_idx == 0:  # called only with residual None: a plain identity suffices
            self.input_layernorm = nn.Identity()


class EagleLlamaForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T]) -> hidden [T, hidden], reading the target (or
    previous draft) hidden state of each row from target_hidden[:T]. Invariants: embed_tokens
    and lm_head are the target's modules unless the checkpoint has its own (never written
    here); target_hidden keeps its address once sized (graphs read it)."""

    def __init__(self, cfg: DecoderConfig, max_len: int, fc_bias: bool,
                 embed_tokens: nn.Embedding, lm_head: nn.Module) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = embed_tokens
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList(EagleDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.rotary_emb = RotaryEmbedding(cfg, max_len)
        self.lm_head = lm_head
        self.register_buffer("target_hidden", torch.zeros(0, cfg.hidden_size),
                             persistent=False)

    def size_states(self, max_tokens: int) -> None:
        """Allocate target_hidden for steps of up to max_tokens rows (once, before any run)."""
        weight = self.fc.weight
        self.target_hidden = torch.zeros(max_tokens, self.config.hidden_size,
                                         dtype=weight.dtype, device=weight.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> the head's hidden states [T, hidden] (pre-lm_head)."""
        states = self.target_hidden[:input_ids.shape[0]]
        hidden = self.fc(torch.cat((self.embed_tokens(input_ids), states), dim=-1))
        rope = self.rotary_emb(positions)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, rope)
        return hidden + residual  # no final norm: the next draft step reads it as is

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab]."""
        return self.lm_head(hidden)
