"""EAGLE draft heads over a Llama-family target, in the published layouts: EAGLE-1 (fc over
concat(embed, target hidden), Llama layers, the first without input_layernorm, no final norm)
and EAGLE-3 (a midlayer over concat(embeds, hidden), norm, a draft-vocabulary lm_head, d2t).
Hidden inputs arrive through a fixed buffer (`target_hidden`), so forward keeps the
(input_ids, positions) contract that runners and CUDA graphs call."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.layers import GatedMLP, RMSNorm
from compiled_llm.models.llama import LlamaAttention, LlamaDecoderLayer
from compiled_llm.models.rotary import RotaryEmbedding


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

    def states(self, num_tokens: int) -> torch.Tensor:
        """target_hidden[:num_tokens]; the check tells the tracer that the slice is whole, so
        its length stays num_tokens (without it, a slice whose end may pass the buffer's gets
        a data-dependent length under some torch versions)."""
        torch._check(num_tokens <= self.target_hidden.shape[0])
        return self.target_hidden[:num_tokens]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> the head's hidden states [T, hidden] (pre-lm_head)."""
        states = self.states(input_ids.shape[0])
        hidden = self.fc(torch.cat((self.embed_tokens(input_ids), states), dim=-1))
        rope = self.rotary_emb(positions)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, rope)
        return hidden + residual  # no final norm: the next draft step reads it as is

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab]."""
        return self.lm_head(hidden)


class Eagle3DecoderLayer(nn.Module):
    """EAGLE-3's midlayer: attention over concat(input_layernorm(embeds), hidden_norm(hidden))
    (q/k/v read 2 * hidden), the residual stream starting at hidden, then the usual MLP."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, 0)
        width, bias = 2 * cfg.hidden_size, cfg.attention_bias
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(width, proj.out_features, bias=bias))
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, rope):
        """(MLP output, residual stream without it); their sum is the pre-norm output."""
        both = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        attn_out = self.self_attn(both, rope)
        normed, residual = self.post_attention_layernorm(attn_out, hidden)
        return self.mlp(normed), residual


class Eagle3LlamaForCausalLM(EagleLlamaForCausalLM):
    """The EAGLE-3 head: target_hidden holds fc(concat of the target's aux hidden states)
    for rows paired with the target, else the head's own pre-norm output; logits are
    lm_head(norm(hidden)) over draft_vocab_size ids, spread to the target's vocabulary through
    d2t (draft id i is target id i + d2t[i]; the rest -inf). Invariant: fc is applied by the
    proposer, never in forward (feed rows are already hidden-wide)."""

    def __init__(self, cfg: DecoderConfig, max_len: int, fc_in: int, draft_vocab: int,
                 embed_tokens: nn.Embedding, lm_head: nn.Module | None) -> None:
        super().__init__(cfg, max_len, False, embed_tokens, lm_head)
        del self.layers
        self.fc = nn.Linear(fc_in, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.lm_head is None:
            self.lm_head = nn.Linear(cfg.hidden_size, draft_vocab, bias=False)
        self.register_buffer("d2t", None if draft_vocab == cfg.vocab_size
                             else torch.zeros(draft_vocab, dtype=torch.int64))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> the head's pre-norm hidden states [T, hidden]."""
        states = self.states(input_ids.shape[0])
        out, residual = self.midlayer(self.embed_tokens(input_ids), states,
                                      self.rotary_emb(positions))
        return out + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, target vocab] (-inf outside the draft vocab)."""
        logits = self.lm_head(self.norm(hidden))
        if self.d2t is None:
            return logits
        spread = logits.new_full((len(hidden), self.config.vocab_size), float("-inf"))
        ids = torch.arange(len(self.d2t), device=logits.device) + self.d2t
        return spread.index_copy_(1, ids, logits)
