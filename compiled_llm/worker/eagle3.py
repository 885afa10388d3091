"""The EAGLE-3 proposer: the published head (fc.weight [H, 3H] over the target's states at three
layers, midlayer.* over concat(embeds, hidden), norm, lm_head over draft_vocab_size ids with
d2t) run as the EAGLE-1 proposer runs its head. The target's states are written by taps inside
its forward (aux_states.py), installed before it compiles, so eager, compiled and CUDA-graph
targets all hand them over."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.config import EngineArgs, SchedulerConfig
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.eagle import Eagle3LlamaForCausalLM
from compiled_llm.sample.spec_decode.proposers import register_proposer
from compiled_llm.speculative import speculative_config_of
from compiled_llm.worker.aux_states import AuxHiddenStates, install_aux_taps
from compiled_llm.worker.eagle import (
    _FIELD,
    EagleProposer,
    copy_weights,
    read_config,
    read_tensors,
)
from compiled_llm.worker.model_runner import ModelRunner, step_tokens


def aux_layer_ids(config: dict, num_layers: int) -> list[int]:
    """The target layers whose input hidden state (embeddings for layer 0) the head reads:
    eagle_config.eagle_aux_hidden_state_layer_ids, else vLLM's (2, L // 2, L - 3)."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = list(ids) if ids else [2, num_layers // 2, num_layers - 3]
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{_FIELD}: eagle_aux_hidden_state_layer_ids {ids} name layers the "
                         f"target's {num_layers} do not have (set eagle_config."
                         "eagle_aux_hidden_state_layer_ids in the head's config.json)")
    return ids


def decoder_layers(model: nn.Module) -> int:
    """How many decoder layers the target has: model.layers' length (LongCat-Flash's and
    DiffLlama's num_hidden_layers count their KV-cache slots, two a layer)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return len(layers) if isinstance(layers, nn.ModuleList) else model.config.num_hidden_layers


def tap_target(args: EngineArgs, model: nn.Module, sched: SchedulerConfig, dtype: torch.dtype,
               device: torch.device) -> AuxHiddenStates | None:
    """When args ask for EAGLE-3: tap the target layers its head reads (ids from the head's
    config.json) for forwards of the step buffers' size. Before the target compiles, so its
    graphs (and the compile cache key) include the writes."""
    cfg = speculative_config_of(args.speculative_config)
    if cfg is None or cfg.method != "eagle3":
        return None
    try:
        ids = aux_layer_ids(read_config(cfg.model, model.config), decoder_layers(model))
    except ValueError:
        return None  # load_eagle3 raises it again, after checks that name a better fix
    rows = step_tokens(args.compile_config(), sched.max_num_seqs, sched.max_num_batched_tokens)
    return install_aux_taps(model, ids, rows, dtype, device)


def load_eagle3(model_dir: str, target: nn.Module, dtype: torch.dtype, device: torch.device,
                max_len: int, load_format: str = "auto"
                ) -> tuple[Eagle3LlamaForCausalLM, list[int]]:
    """(head, aux layer ids) of an EAGLE-3 checkpoint over target; ValueError naming the
    field when it is missing, incomplete or shaped unlike the target."""
    config = read_config(model_dir, target.config)
    tensors = read_tensors(model_dir, load_format, eagle3=True)
    tensors.pop("t2d", None)  # the inverse map: nothing reads it at inference
    width = config.get("target_hidden_size") or config["hidden_size"]
    if width != target.config.hidden_size:
        raise ValueError(f"{_FIELD}: the EAGLE-3 head's target_hidden_size {width} differs "
                         f"from the target's hidden_size {target.config.hidden_size}")
    bias = config.get("attention_bias", "midlayer.self_attn.q_proj.bias" in tensors)
    cfg = DecoderConfig.from_hf({**config, "tie_word_embeddings": False, "attention_bias": bias,
                                 "o_proj_bias": "midlayer.self_attn.o_proj.bias" in tensors})
    draft_vocab = config.get("draft_vocab_size") or cfg.vocab_size
    if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= cfg.vocab_size:
        raise ValueError(f"{_FIELD}: draft_vocab_size must be an integer in 1..{cfg.vocab_size}"
                         f", got {draft_vocab!r}")
    ids = aux_layer_ids(config, decoder_layers(target))
    own = {name for name in ("embed_tokens", "lm_head") if f"{name}.weight" in tensors}
    if "lm_head" not in own and draft_vocab != cfg.vocab_size:
        raise ValueError(f"{_FIELD}: the EAGLE-3 checkpoint lacks lm_head.weight (its "
                         f"draft_vocab_size {draft_vocab} is not the target's vocabulary)")
    embed = (nn.Embedding(cfg.vocab_size, cfg.hidden_size) if "embed_tokens" in own
             else target.model.embed_tokens)
    lm_head = None if "lm_head" in own else target.lm_head
    head = Eagle3LlamaForCausalLM(cfg, max_len, len(ids) * width, draft_vocab, embed, lm_head)
    if head.d2t is not None:
        _load_d2t(head, tensors.pop("d2t", None), cfg.vocab_size)
    tensors.pop("d2t", None)
    params = {name: param for name, param in head.named_parameters()
              if name.split(".")[0] in own or name.split(".")[0] not in ("embed_tokens",
                                                                           "lm_head")}
    copy_weights(params, tensors, "an EAGLE-3 head")
    return head.to(device=device, dtype=dtype).eval(), ids


def _load_d2t(head: Eagle3LlamaForCausalLM, d2t: torch.Tensor | None, vocab: int) -> None:
    """Check and keep the draft-to-target offsets (target id = draft id + d2t[draft id])."""
    if d2t is None or d2t.shape != head.d2t.shape:
        shape = None if d2t is None else tuple(d2t.shape)
        raise ValueError(f"{_FIELD}: the EAGLE-3 checkpoint needs d2t of shape "
                         f"{tuple(head.d2t.shape)} for its draft_vocab_size, got {shape}")
    ids = torch.arange(len(d2t)) + d2t.to(torch.int64)
    if bool(((ids < 0) | (ids >= vocab)).any()) or len(ids.unique()) != len(ids):
        raise ValueError(f"{_FIELD}: d2t maps draft ids outside the target's vocabulary of "
                         f"{vocab} or onto one id twice")
    head.d2t.copy_(d2t)


@register_proposer("eagle3")
class Eagle3Proposer(EagleProposer):
    """Proposes with an EAGLE-3 head: each computed position's hidden input is fc of the
    target's aux states there, then the head feeds itself its pre-norm output."""

    def load_head(self, target: ModelRunner, load_format: str) -> Eagle3LlamaForCausalLM:
        """The head, reading the aux states that the target's taps (tap_target) write."""
        head, ids = load_eagle3(self.cfg.model, target.model, target.dtype, target.device,
                                target.max_model_len, load_format)
        aux = getattr(target.model, "aux_hidden_states", None)
        if aux is None or aux.ids != ids or aux.rows < target.input_batch.max_tokens:
            raise RuntimeError("EAGLE-3: the target was built without taps for layers "
                               f"{ids} of {target.input_batch.max_tokens} rows (tap_target "
                               "runs before the target compiles)")
        self.head, self.aux = head, aux
        return head

    def take_states(self, rows: dict[str, tuple[int, int]], hidden: torch.Tensor) -> None:
        """Keep fc(aux states) of this step's rows in place of the final hidden states."""
        with torch.inference_mode():
            super().take_states(rows, self.head.fc(self.aux.states(len(hidden))))
