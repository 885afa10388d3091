"""Gemma 3n text decoder (Gemma3nForCausalLM: gemma-3n E2B, E4B, the text stack of their
image-audio-text checkpoints): Gemma 4's attention (q/k/v norms, unit scale, KV sharing) and
per-layer inputs (PLE) inside AltUp's parallel streams (predict, then correct with learned
coefficients), a Laurel low-rank residual, MLPs with a gaussian top-k activation sparsity.
Config reading: gemma3n_config.py."""

from __future__ import annotations

import math

import torch
from torch import nn

from compiled_llm.models.gemma3n_config import Gemma3nConfig
from compiled_llm.models.gemma4 import (
    KV,
    Gemma4Attention,
    Gemma4ForCausalLM,
    Gemma4Model,
    Rope,
    unit_rms_norm,
)
from compiled_llm.models.gemma4_tp import shard_sparse_mlp
from compiled_llm.models.layers import ACTIVATIONS, Float32ScaleRMSNorm
from compiled_llm.models.tp_helpers import RowSum


def rescaled(hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """hidden scaled to the root-mean-square `target` (its own floored at sqrt(1e-5))."""
    magnitude = torch.sqrt(torch.mean(hidden**2, dim=-1, keepdim=True).clamp(min=1e-5))
    return hidden * target / magnitude


class Gemma3nHardEmbedder(nn.Module):
    """A vision / audio token id's embedding (Gemma3nMultimodalEmbedder on ids): its own table,
    normed, projected to hidden_size, normed without a weight."""

    def __init__(self, offset: int, vocab: int, dim: int, eps: float, hidden: int) -> None:
        super().__init__()
        self.offset, self.vocab, self.eps = offset, vocab, eps
        self.embedding = nn.Embedding(vocab, dim)
        self.hard_embedding_norm = Float32ScaleRMSNorm(dim, eps)
        self.embedding_projection = nn.Linear(dim, hidden, bias=False)

    def forward(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """embeds [T, hidden] with the rows of this embedder's ids replaced."""
        ids = (input_ids - self.offset).clamp(0, self.vocab - 1)
        own = self.embedding_projection(self.hard_embedding_norm(self.embedding(ids)))
        inside = (input_ids >= self.offset) & (input_ids < self.offset + self.vocab)
        return torch.where(inside[:, None], unit_rms_norm(own, self.eps).to(embeds.dtype), embeds)


class Gemma3nAltUp(nn.Module):
    """AltUp over [A, T, hidden] streams: predict mixes the streams by coefficients routed from
    the active one; correct spreads the layer's innovation on it back to every stream."""

    def __init__(self, cfg: Gemma3nConfig) -> None:
        super().__init__()
        self.streams, self.active = cfg.altup_num_inputs, cfg.altup_active_idx
        self.correct_output_scale = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.correction_coefs = nn.Linear(self.streams, self.streams, bias=False)
        self.prediction_coefs = nn.Linear(self.streams, self.streams**2, bias=False)
        self.modality_router = nn.Linear(cfg.hidden_size, self.streams, bias=False)
        self.router_norm = Float32ScaleRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("router_input_scale", torch.tensor(cfg.hidden_size**-1.0),
                             persistent=False)

    def modalities(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> the router's tanh outputs [T, A]."""
        routed = self.modality_router(self.router_norm(hidden) * self.router_input_scale)
        return torch.tanh(routed.float()).type_as(hidden)

    def predict(self, hidden: torch.Tensor) -> torch.Tensor:
        """[A, T, hidden] -> predictions [A, T, hidden]: stream i + sum_j c[i, j] stream j."""
        modalities = self.modalities(hidden[self.active])
        coefs = self.prediction_coefs(modalities).view(-1, self.streams, self.streams)  # [T,A,A]
        # bmm, not matmul: torch 2.11's matmul of two 3-D tensors asks for concrete sizes,
        # which an unbacked T (the compiled graph's token count) has not
        mixed = torch.bmm(hidden.permute(1, 2, 0), coefs.transpose(1, 2))  # [T, hidden, A]
        return (mixed.permute(2, 0, 1) + hidden).type_as(hidden)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """predictions [A, T, hidden], the layer's output [T, hidden] -> corrected streams."""
        coefs = self.correction_coefs(self.modalities(activated)) + 1.0  # [T, A]
        innovation = activated - predictions[self.active]
        return (innovation * coefs.t().unsqueeze(-1) + predictions).type_as(activated)


class Gemma3nLaurel(nn.Module):
    """Laurel: x + norm(linear_right(linear_left(x))), a rank-laurel_rank residual."""

    def __init__(self, cfg: Gemma3nConfig) -> None:
        super().__init__()
        self.linear_left = nn.Linear(cfg.hidden_size, cfg.laurel_rank, bias=False)
        self.linear_right = nn.Linear(cfg.laurel_rank, cfg.hidden_size, bias=False)
        self.post_laurel_norm = Float32ScaleRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        return hidden + self.post_laurel_norm(self.linear_right(self.linear_left(hidden)))


class Gemma3nMLP(nn.Module):
    """The gated MLP, its gate cut below mean + std * icdf(sparsity) per token (gaussian
    top-k: a fixed-shape relu, no sort) where the layer's activation sparsity is set."""

    def __init__(self, cfg: Gemma3nConfig, layer_idx: int) -> None:
        super().__init__()
        inter = cfg.intermediate_sizes[layer_idx]
        self.gate_proj = nn.Linear(cfg.hidden_size, inter, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, cfg.hidden_size, bias=False)
        self.act_fn = ACTIVATIONS[cfg.hidden_act]
        self.std_multiplier = cfg.sparsity_std_multipliers[layer_idx]
        if self.std_multiplier is not None:
            self.register_buffer("cutoff_stds", torch.tensor(self.std_multiplier),
                                 persistent=False)
            self.width, self.gate_sum = inter, RowSum()  # all-reduced under TP: gemma4_tp.py

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        gate = self.gate_proj(hidden)
        if self.std_multiplier is not None:  # the whole row's mean and (population) std,
            gate_f32 = gate.float()  # accumulated in float32 and cast, as torch.mean / std do
            mean = self.gate_sum(gate_f32) / self.width
            std = torch.sqrt(self.gate_sum((gate_f32 - mean).pow(2)) / self.width)
            cutoff = mean.to(gate.dtype) + std.to(gate.dtype) * self.cutoff_stds.to(gate.dtype)
            gate = torch.relu(gate - cutoff)
        return self.down_proj(self.act_fn(gate) * self.up_proj(hidden))

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """Tensor parallelism by intermediate rows, the gate's sums all-reduced."""
        shard_sparse_mlp(self, sharder, prefix)


class Gemma3nDecoderLayer(nn.Module):
    """AltUp's predict; on the active stream Gemma 3's norms around attention and the MLP, with
    Laurel beside attention; AltUp's correct; the per-layer input's gated projection of the
    (scaled) active stream added to every stream but the first."""

    def __init__(self, cfg: Gemma3nConfig, layer_idx: int) -> None:
        super().__init__()
        self.sliding, self.layer_idx = cfg.is_sliding(layer_idx), layer_idx
        self.active, self.correct_scale = cfg.altup_active_idx, cfg.altup_correct_scale
        self.self_attn = Gemma4Attention(cfg, layer_idx)
        self.mlp = Gemma3nMLP(cfg, layer_idx)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_per_layer_input_norm"):
            setattr(self, name, Float32ScaleRMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.altup = Gemma3nAltUp(cfg)
        self.laurel = Gemma3nLaurel(cfg)
        self.act_fn = ACTIVATIONS[cfg.hidden_act]
        ple = cfg.hidden_size_per_layer_input
        self.per_layer_input_gate = nn.Linear(cfg.hidden_size, ple, bias=False)
        self.per_layer_projection = nn.Linear(ple, cfg.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, rope: Rope, shared_kv: KV,
                per_layer_input: torch.Tensor) -> torch.Tensor:
        """hidden [A, T, hidden], per_layer_input [T, ple] -> [A, T, hidden]."""
        predictions = self.altup.predict(hidden)
        active = predictions[self.active]
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.post_attention_layernorm(self.self_attn(normed, rope, shared_kv))
        attn_laurel = (active + attn + laurel) / math.sqrt(2)
        ffw = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(
            attn_laurel)))
        corrected = self.altup.correct(predictions, attn_laurel + ffw)
        first = corrected[self.active]
        if self.correct_scale:
            first = (first.type_as(self.altup.correct_output_scale)
                     * self.altup.correct_output_scale).type_as(first)
        gated = self.act_fn(self.per_layer_input_gate(first)) * per_layer_input
        first = self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return torch.cat([corrected[:1], corrected[1:] + first])  # every stream but the 0th


class Gemma3nModel(Gemma4Model):
    """Gemma 4's embeddings, per-layer inputs (ids past vocab_size_per_layer_input read row
    0), rotary tables and final norm around AltUp: the embedding spread to altup_num_inputs
    streams by projections rescaled to its magnitude, the streams unprojected and averaged."""

    layer_cls = Gemma3nDecoderLayer

    def __init__(self, cfg: Gemma3nConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.vocab_size_per_layer_input = cfg.vocab_size_per_layer_input
        extra = range(1, cfg.altup_num_inputs)
        self.altup_projections = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False) for _ in extra)
        self.altup_unembed_projections = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False) for _ in extra)
        self.hard_embedders = [name for name, *_ in cfg.hard_token_embedders]
        for name, offset, vocab, dim, eps in cfg.hard_token_embedders:
            setattr(self, name, Gemma3nHardEmbedder(offset, vocab, dim, eps, cfg.hidden_size))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]: the scaled text embedding, or a vision / audio id's own."""
        embeds = self.embed_tokens(input_ids) * self.embed_scale.to(self.embed_tokens.weight.dtype)
        for name in self.hard_embedders:
            embeds = getattr(self, name)(input_ids, embeds)
        return embeds

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        embeds = self.embed(input_ids)
        in_table = (input_ids >= 0) & (input_ids < self.vocab_size_per_layer_input)
        per_layer = self.per_layer_inputs(torch.where(in_table, input_ids, 0), embeds)
        target = torch.mean(embeds**2, dim=-1, keepdim=True) ** 0.5
        hidden = torch.stack([embeds] + [rescaled(proj(embeds), target)
                                         for proj in self.altup_projections])  # [A, T, hidden]
        ropes = {False: self.rotary_emb(positions), True: self.local_rotary_emb(positions)}
        shared_kv: KV = {}
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, ropes[layer.sliding], shared_kv, per_layer[:, i])
        target = torch.mean(hidden[0] ** 2, dim=-1, keepdim=True) ** 0.5
        streams = [hidden[0]] + [rescaled(proj(hidden[i + 1]), target)
                                 for i, proj in enumerate(self.altup_unembed_projections)]
        return self.norm(torch.stack(streams).mean(0))


class Gemma3nForCausalLM(Gemma4ForCausalLM):
    """Gemma 3n for causal LM: Gemma 4's contract (soft-capped logits, KV-shared layers' K/V
    tensors skipped) over Gemma3nModel."""

    model_cls = Gemma3nModel
    config_cls = Gemma3nConfig
    hf_defaults = {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "head_dim": 256,
                   "sliding_window": 512, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 32768, "num_key_value_heads": 2,
                   "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 256,
                   "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 15}
    text_side_modules = ("embed_vision.", "embed_audio.")  # multimodal.py's TextStack keeps

    def weight_name(self, hf_name: str) -> str | None:
        """Gemma 4's names; the embedders' soft-token norm (images, audio only) skipped."""
        if ".soft_embedding_norm." in hf_name:
            return None
        return super().weight_name(hf_name)

    # altup_coef_clip clamps the coefficients in training only
    # (and its 4.x configs' rope_theta / rope_local_base_freq / rope_scaling are read)
    hf_unread = tuple(key for key in Gemma4ForCausalLM.hf_unread if key not in (
        "rope_theta", "rope_scaling", "rope_local_base_freq")) + ("altup_coef_clip",)
