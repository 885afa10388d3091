"""The EAGLE-1 proposer: the published head checkpoint (config.json of a one-layer Llama; fc.weight
[H, 2H], optional fc.bias, layers.{i}.* without layers.0.input_layernorm, optional embed_tokens /
lm_head, else the target's) on its own ModelRunner, its paged KV on the target's block ids as the
draft model's. Position p pairs token p+1 with the target's hidden state at p: the head runs over
the positions the target just computed, then feeds itself k - 1 times (its own hidden states)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.eagle import EagleLlamaForCausalLM
from compiled_llm.sample.spec_decode.proposers import (
    Proposer,
    Sampled,
    new_tokens_of,
    register_proposer,
    spec_eligible,
)
from compiled_llm.sample.uploads import upload
from compiled_llm.speculative import SpeculativeConfig
from compiled_llm.worker.draft_model import (
    SHADOW_PARAMS,
    DraftModelProposer,
    check_room,
    draft_backend,
)
from compiled_llm.worker.loader import checkpoint_files, iter_tensors, load_hf_config
from compiled_llm.worker.model_runner import ModelRunner, step_tokens

_FIELD = "speculative_config.model"
_REQUIRED = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")
# checkpoint names that carry nothing of ours: EAGLE omits layer 0's input norm (some exports
# still save it), and rotary buffers
_IGNORED = ("layers.0.input_layernorm.weight", "rotary_emb.inv_freq")


def read_config(model_dir: str, target_cfg: DecoderConfig) -> dict:
    """The head's config.json, checked against the target (ValueError naming the field)."""
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"{_FIELD}: no EAGLE config.json in {model_dir!r}")
    config = load_hf_config(model_dir)
    for name in _REQUIRED:
        if not isinstance(config.get(name), int):
            raise ValueError(f"{_FIELD}: the EAGLE config.json lacks {name}")
    for name in ("hidden_size", "vocab_size"):
        if config[name] != getattr(target_cfg, name):
            raise ValueError(f"{_FIELD}: the EAGLE head's {name} {config[name]} differs from "
                             f"the target's {getattr(target_cfg, name)}")
    return config


def read_tensors(model_dir: str, load_format: str, eagle3: bool = False
                  ) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint by name (a "model." prefix dropped, as vLLM does);
    ValueError when it is of the other EAGLE generation."""
    try:
        files = checkpoint_files(Path(model_dir), load_format)
    except ValueError as err:
        raise ValueError(f"{_FIELD}: {err}") from None
    tensors = {name.removeprefix("model."): tensor for name, tensor, _ in iter_tensors(files)}
    if eagle3 != any(name.startswith("midlayer.") for name in tensors):
        kind, method = ("an EAGLE-1", "eagle") if eagle3 else ("an EAGLE-3", "eagle3")
        raise ValueError(f"{_FIELD}: {model_dir!r} is {kind} checkpoint (midlayer.* names "
                         f"EAGLE-3); use speculative_config.method {method!r}")
    return tensors


def copy_weights(params: dict[str, torch.nn.Parameter], tensors: dict[str, torch.Tensor],
                 what: str) -> None:
    """Copy every checkpoint tensor into its parameter; ValueError naming the weight that is
    unknown to `what`, shaped otherwise, or missing."""
    for name, tensor in tensors.items():
        param = params.get(name)
        if param is None:
            if name.endswith(_IGNORED):
                continue
            raise ValueError(f"{_FIELD}: the EAGLE checkpoint has {name}, which {what} "
                             "does not")
        if tensor.shape != param.shape:
            raise ValueError(f"{_FIELD}: {name} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise ValueError(f"{_FIELD}: the EAGLE checkpoint lacks {missing[:4]}")


def load_eagle(model_dir: str, target: torch.nn.Module, dtype: torch.dtype,
               device: torch.device, max_len: int, load_format: str = "auto"
               ) -> EagleLlamaForCausalLM:
    """The EAGLE-1 head of model_dir over target (a Llama-family model); ValueError naming the
    field when the checkpoint is missing, incomplete or shaped unlike the target."""
    config = read_config(model_dir, target.config)
    tensors = read_tensors(model_dir, load_format)
    # Qwen2-style heads have biased q/k/v without saying so in config.json
    bias = config.get("attention_bias", "layers.0.self_attn.q_proj.bias" in tensors)
    cfg = DecoderConfig.from_hf({**config, "tie_word_embeddings": False, "attention_bias": bias,
                                 "o_proj_bias": "layers.0.self_attn.o_proj.bias" in tensors})
    embed = getattr(getattr(target, "model", None), "embed_tokens", None)
    if embed is None and "embed_tokens.weight" not in tensors:
        raise ValueError(f"{_FIELD}: the EAGLE checkpoint lacks embed_tokens.weight and the "
                         "target has no model.embed_tokens to share")
    if "embed_tokens.weight" in tensors:
        embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    lm_head = target.lm_head
    if "lm_head.weight" in tensors:
        lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    head = EagleLlamaForCausalLM(cfg, max_len, "fc.bias" in tensors, embed, lm_head)
    # the target's own modules are read, never written
    shared = [name for name in ("embed_tokens", "lm_head") if f"{name}.weight" not in tensors]
    params = {name: param for name, param in head.named_parameters()
              if name.split(".")[0] not in shared}
    copy_weights(params, tensors, f"an EAGLE-1 head of {cfg.num_hidden_layers} layers")
    return head.to(device=device, dtype=dtype).eval()


@dataclass
class _Shadow:
    """The head's view of one request: a Request whose all_token_ids[p] is the token at p + 1
    (the one paired with the target's hidden state at p), on the target's block list."""

    req: Request


@dataclass
class _Job:
    """One request's part of a head step: its shadow, the first position it computes, the
    target rows holding the hidden states of its positions, and whether it proposes."""

    shadow: _Shadow
    start: int
    rows: range
    proposes: bool
    temperature: float = 0.0


@register_proposer("eagle")
class EagleProposer(DraftModelProposer):
    """Proposes with an EAGLE-1 head; greedy requests take its argmax (one-hot q), sampled
    ones draw from its temperature-scaled distribution (q kept for the verifier), as the
    draft model does. Invariant: the head's K/V at position p was computed from the target's
    hidden state at p once the target has computed p; later positions are rewritten."""

    uses_target_states = True

    def __init__(self, cfg: SpeculativeConfig, target: ModelRunner, args=None,
                 num_blocks: int = 0, **context) -> None:
        Proposer.__init__(self, cfg)  # not the draft model's: the head loads differently
        self.target = target
        head = self.load_head(target, getattr(args, "load_format", "auto"))
        tokens = target.max_num_batched_tokens + target.max_num_seqs * (self.k + 1)
        # sized before the runner compiles: the buffer's shape keys its compiled code
        head.size_states(step_tokens(target.compile_cfg, target.max_num_seqs, tokens))
        self.runner = ModelRunner(head, target.device, target.dtype, target.cache_cfg,
                                  target.compile_cfg, target.max_model_len,
                                  draft_backend(target, args, head.config.head_dim),
                                  target.max_num_seqs, tokens)
        check_room(self.runner, num_blocks)
        self.runner.allocate_kv_cache(num_blocks)  # mirrored: the target's block ids
        self.runner.execute_dummy(1, 1)
        self.runner.capture_cudagraphs()
        self.shadows: dict[str, _Shadow] = {}
        self.probs: dict[str, list[torch.Tensor]] = {}
        self.generators: dict[str, torch.Generator] = {}
        self._released: tuple[set[str], set[str]] = (set(), set())
        self.states: tuple[dict[str, tuple[int, int]], torch.Tensor | None] = ({}, None)

    def load_head(self, target: ModelRunner, load_format: str) -> EagleLlamaForCausalLM:
        """The head of speculative_config.model, on the target's device and dtype."""
        return load_eagle(self.cfg.model, target.model, target.dtype, target.device,
                          target.max_model_len, load_format)

    def take_states(self, rows: dict[str, tuple[int, int]], hidden: torch.Tensor) -> None:
        """The target's hidden states [T, hidden] of this step and, per request, (first row,
        number of rows that hold computed positions)."""
        self.states = (rows, hidden)

    @torch.inference_mode()
    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Run the head over the positions the target computed, then k drafts per request."""
        rows, hidden = self.states
        self.states = ({}, None)
        self.probs = {}
        jobs = [job for req, _ in sched.scheduled
                if (job := self._eagle_job(req, rows.get(req.request_id),
                                           sampled.get(req.request_id))) is not None]
        if not jobs or hidden is None:
            return {}
        index = upload([row for job in jobs for row in job.rows], torch.int64, hidden.device)
        items = [(job.shadow.req, len(job.rows)) for job in jobs]
        for job in jobs:
            job.shadow.req.num_computed_tokens = job.start
        proposing = [job for job in jobs if job.proposes]
        logits, last = self._run(items, proposing, hidden.index_select(0, index))
        drafts: dict[str, list[int]] = {}
        for step in range(self.k):
            if not proposing:
                break
            self._draw(proposing, logits, drafts)
            keep = [i for i, job in enumerate(proposing) if self._fits(job.shadow.req)]
            proposing = [proposing[i] for i in keep]
            if step + 1 < self.k and proposing:
                for job in proposing:
                    job.shadow.req.all_token_ids.append(drafts[job.shadow.req.request_id][-1])
                states = last.index_select(0, upload(keep, torch.int64, last.device))
                logits, last = self._run([(job.shadow.req, 1) for job in proposing],
                                         proposing, states)
        return drafts

    def _eagle_job(self, req: Request, rows: tuple[int, int] | None,
                   new: int | list[int] | None) -> _Job | None:
        """This step's head work for one request (None: no target rows, nothing to pair)."""
        if rows is None:
            return None
        first, count = rows
        start = req.num_computed_tokens  # the step's first position (not yet advanced)
        tokens = req.all_token_ids + ([] if new is None else new_tokens_of(new))
        # position p needs token p + 1; the K/V slot must be in a held block
        end = min(start + count, len(tokens) - 1,
                  len(req.block_ids) * self.runner.cache_cfg.block_size)
        if start >= end:
            return None
        shadow = self.shadows.get(req.request_id)
        if shadow is None:  # new or preempted: positions below start keep the mirrored K/V
            shadow = self.shadows[req.request_id] = _Shadow(
                Request(req.request_id, [], SHADOW_PARAMS))
        shadow.req.block_ids = req.block_ids  # the same list: the table rows follow it
        shadow.req.all_token_ids = tokens[1:end + 1]
        proposes = (new is not None and end == len(tokens) - 1 and not req.is_finished
                    and spec_eligible(req))
        if proposes:
            self.track_seed(req)
        return _Job(shadow, start, range(first, first + end - start), proposes,
                    req.sampling_params.temperature)

    def _run(self, items: list[tuple[Request, int]], proposing: list[_Job],
             states: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One head forward over items with states as its hidden inputs (row for row);
        (logits, hidden) at the proposing jobs' last positions, in their order."""
        self.runner.model.target_hidden[:len(states)].copy_(states)
        finished, preempted = self._released
        self._released = (set(), set())
        step = self.runner.launch_forward(SchedulerOutput(items, finished, preempted))
        if step.result.skipped:  # rows would no longer line up with the states
            raise RuntimeError(f"EAGLE head step left requests out: {step.result.skipped}")
        for req, count in items:
            req.num_computed_tokens += count
        if not proposing:
            return None, None
        at = {req.request_id: i for i, req in enumerate(step.inputs.sample_reqs)}
        index = upload([at[job.shadow.req.request_id] for job in proposing], torch.int64,
                       step.hidden.device)
        last = step.hidden.index_select(0, step.inputs.sample_rows).index_select(0, index)
        return self.runner.model.compute_logits(last).float(), last
