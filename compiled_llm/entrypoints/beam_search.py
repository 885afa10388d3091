"""LLM.beam_search as vLLM's: every step extends each live beam by one token through
LLM.generate (its 2 * beam_width most likely next tokens), keeps the beam_width best by
length-penalised cumulative logprob, and sets aside beams that end in EOS or reach
max_model_len."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiled_llm.output.outputs import Logprob
from compiled_llm.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from compiled_llm.entrypoints.llm import LLM
    from compiled_llm.lora.request import LoRARequest


@dataclass
class BeamSearchSequence:
    """One beam: its tokens (the prompt's first), each new token's logprobs dict, the sum of
    the chosen tokens' logprobs and, once finished, its text (the whole sequence decoded)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    lora_request: LoRARequest | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's best beams, best first."""

    sequences: list[BeamSearchSequence]


@dataclass
class _Instance:
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)

    def set_aside(self, ends) -> None:
        """Move the live beams for which ends(beam) holds to the completed ones."""
        ended = [ends(beam) for beam in self.beams]
        self.completed += [beam for beam, end in zip(self.beams, ended) if end]
        self.beams = [beam for beam, end in zip(self.beams, ended) if not end]


def beam_score(beam: BeamSearchSequence, eos_token_id: int | None, length_penalty: float):
    """Cumulative logprob / length ** length_penalty (an ending EOS is not counted)."""
    length = len(beam.tokens) - (eos_token_id is not None and beam.tokens[-1] == eos_token_id)
    return beam.cum_logprob / (length ** length_penalty)


def beam_search(llm: LLM, prompts: Sequence[Any], params: BeamSearchParams,
                lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                ) -> list[BeamSearchOutput]:
    """The beams of every prompt (a string, or a TextPrompt / TokensPrompt dict)."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    tokenizer = llm.get_tokenizer()
    eos = None if tokenizer is None else tokenizer.eos_token_id
    loras = lora_request if isinstance(lora_request, list | tuple) else \
        [lora_request] * len(prompts)
    if len(loras) != len(prompts):
        raise ValueError(f"lora_request: got {len(loras)} for {len(prompts)} prompts")
    instances = [_Instance([BeamSearchSequence(_prompt_ids(llm, p), [], lora)])
                 for p, lora in zip(prompts, loras)]
    step = SamplingParams(logprobs=2 * params.beam_width, max_tokens=1,
                          temperature=params.temperature)
    for _ in range(params.max_tokens):
        for instance in instances:  # a beam as long as max_model_len ends there ("length")
            instance.set_aside(lambda b: len(b.tokens) >= llm.engine.max_model_len)
        beams = [beam for instance in instances for beam in instance.beams]
        if not beams:
            break
        outs = llm.generate([{"prompt_token_ids": b.tokens} for b in beams], step,
                            use_tqdm=False, lora_request=[b.lora_request for b in beams])
        bounds = list(itertools.accumulate([0] + [len(i.beams) for i in instances]))
        for instance, start, end in zip(instances, bounds, bounds[1:]):
            instance.beams = [child for beam, out in zip(beams[start:end], outs[start:end])
                              for child in _children(beam, out)]
            instance.set_aside(lambda b: b.tokens[-1] == eos and not params.ignore_eos)
            instance.beams.sort(key=lambda b: beam_score(b, eos, params.length_penalty),
                                reverse=True)
            del instance.beams[params.beam_width:]
    return [_best(instance, params, eos, tokenizer) for instance in instances]


def _prompt_ids(llm: LLM, prompt: Any) -> list[int]:
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if isinstance(prompt, list):  # token ids
        return list(prompt)
    text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
    if not isinstance(text, str) or llm.get_tokenizer() is None:
        raise ValueError("prompts: each must be a string, a TextPrompt or a TokensPrompt "
                         "(text needs the tokenizer)")
    return llm.get_tokenizer().encode(text)


def _children(beam: BeamSearchSequence, out) -> list[BeamSearchSequence]:
    """The beam extended by each token of its step's logprobs."""
    row = out.outputs[0].logprobs[0]
    return [BeamSearchSequence(beam.tokens + [token], beam.logprobs + [row], beam.lora_request,
                               beam.cum_logprob + logprob.logprob)
            for token, logprob in row.items()]


def _best(instance: _Instance, params: BeamSearchParams, eos: int | None,
          tokenizer) -> BeamSearchOutput:
    """The beam_width best of the ended and the live beams, each decoded."""
    ranked = sorted(instance.completed + instance.beams,
                    key=lambda b: beam_score(b, eos, params.length_penalty), reverse=True)
    best = ranked[:params.beam_width]
    for beam in best:
        ended = beam.tokens[-1] == eos and not params.ignore_eos
        beam.finish_reason, beam.stop_reason = ("stop", eos) if ended else ("length", None)
        if tokenizer is not None:
            beam.text = tokenizer.decode(beam.tokens)
    return BeamSearchOutput(best)
