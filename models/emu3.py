"""Emu3's text model (Emu3ForCausalLM): the Llama decoder (attention_bias on q/k/v/o, mlp_bias)
under transformers' Emu3TextConfig defaults. Its image tokens are ids of the same vocabulary,
so a text-only prompt (and Emu3ForConditionalGeneration's text stack) is this model alone."""

from __future__ import annotations

from compiled_llm.models.llama import LlamaForCausalLM


class Emu3ForCausalLM(LlamaForCausalLM):
    """Emu3 text for causal LM: Llama's contract and weight names."""

    # transformers' Emu3TextConfig defaults (config.json may leave them out)
    hf_defaults = {"rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 9216, "num_key_value_heads": 8}
