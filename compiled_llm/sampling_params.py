"""Per-request sampling options (``SamplingParams``), mirroring vLLM's API.

Owns field validation and normalisation; the batched math lives in ``sample/sampler.py``.
Pure Python: the scheduler reads these without importing torch.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiled_llm.sample.structured_params import (
    GuidedDecodingParams,  # noqa: F401  (vLLM <= 0.11's name, exported from here as vLLM's)
    StructuredOutputsParams,
    check_text,
)

if TYPE_CHECKING:  # for the LogitsProcessor alias only: this module stays free of torch
    import torch

logger = logging.getLogger(__name__)
# Below this temperature a request is treated as greedy (same threshold as vLLM).
SAMPLING_EPS = 1e-5
MIN_TEMPERATURE = 1e-2  # vLLM's: a smaller positive temperature is raised to it
MAX_TEMPERATURE = 2.0  # vLLM's (and OpenAI's) upper bound

# vLLM-v0 style per-request processor: (output token ids, 1-D logits row) -> logits row
LogitsProcessor = Callable[[list[int], "torch.Tensor"], "torch.Tensor"]

# What the sampler's int64 tensors and torch generators hold: vLLM's seed range.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# top_k is an int32 row of the sampler (clamped to the vocabulary there).
MAX_TOP_K = (1 << 31) - 1


class RequestOutputKind(enum.Enum):
    """What each RequestOutput of a request carries (as vLLM): everything so far, only what is
    new since the last output, or a single output at the end."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingType(enum.IntEnum):
    """How a request draws its tokens: argmax, a shared random stream, or its own seed."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True as a count is almost always a bug.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_real(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _check_range(name: str, value: Any, low: float, high: float, desc: str) -> float:
    value = _check_real(name, value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be {desc}, got {value}")
    return value


def _check_opt_count(name: str, value: Any, minimum: int) -> None:
    if value is not None and (not _is_int(value) or value < minimum):
        raise ValueError(f"{name} must be None or an integer >= {minimum}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _normalise_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)):
        raise ValueError(f"stop must be a string, a list of strings or None, got {stop!r}")
    for stop_str in stops:
        if not isinstance(stop_str, str) or not stop_str:
            raise ValueError(f"stop must contain only non-empty strings, got {stop_str!r}")
        check_text("stop", stop_str)
    return list(stops)


def _is_token_id(value: Any) -> bool:
    # the vocabulary bound is the engine's check (input processor): it knows the model
    return _is_int(value) and 0 <= value <= INT64_MAX


def _normalise_stop_ids(ids: Any) -> list[int]:
    ids = [] if ids is None else ids
    if not isinstance(ids, (list, tuple)) or not all(_is_token_id(t) for t in ids):
        raise ValueError(f"stop_token_ids must be a list of non-negative ints, got {ids!r}")
    return list(dict.fromkeys(ids))  # vLLM's: repeats dropped, first order kept


def _normalise_logit_bias(bias: Any) -> dict[int, float] | None:
    if bias is None:
        return None
    if not isinstance(bias, dict) or not all(_is_token_id(t) for t in bias):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}")
    out = {}
    for token_id, value in bias.items():
        value = _check_real(f"logit_bias[{token_id}]", value)
        if not math.isfinite(value):
            raise ValueError(f"logit_bias values must be finite, got {value} for {token_id}")
        out[token_id] = value
    return out


def _logit_bias_from_json(bias: Any) -> Any:
    """OpenAI's logit_bias (token ids as strings, biases in [-100, 100]) as SamplingParams
    takes it; ValueError naming logit_bias on a key that is not an integer."""
    if not isinstance(bias, dict):
        return bias  # refused by name in __post_init__
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias contains a key that is not an integer token id: "
                             f"{key!r}") from None
        value = _check_real(f"logit_bias[{key}]", value)
        out[token] = min(100.0, max(-100.0, value))
    return out


def _normalise_allowed_ids(ids: Any) -> list[int] | None:
    if ids is None:
        return None
    if (not isinstance(ids, (list, tuple)) or not ids
            or not all(_is_token_id(t) for t in ids)):
        raise ValueError(f"allowed_token_ids must be a non-empty list of non-negative ints, "
                         f"got {ids!r}")
    return list(ids)


@dataclass
class SamplingParams:
    """Sampling options for one request; see vLLM's ``SamplingParams`` for semantics.
    ``temperature < 1e-5`` means greedy, in which case top_p/top_k/min_p are reset to off;
    ``top_k`` of 0 or -1 disables it (stored as 0)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: list[LogitsProcessor] | None = None
    include_stop_str_in_output: bool = False
    # added to the logits of these token ids before sampling (OpenAI's logit_bias)
    logit_bias: dict[int, float] | None = None
    # sample only among these token ids
    allowed_token_ids: list[int] | None = None
    # Grammar-constrained decoding; a dict is converted to StructuredOutputsParams.
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | dict | None = None  # vLLM <= 0.11's name of it
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # never generated: a word's last token is banned where the output ends with the rest
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens (-1: what fits)
    extra_args: dict[str, Any] | None = None  # carried, never read (vLLM: for custom code)

    def __post_init__(self) -> None:
        self._verify_counts()
        self._verify_penalties()
        self._verify_sampling()
        self._verify_stops()
        self._verify_misc()
        self._verify_vllm_extras()
        if self.temperature < SAMPLING_EPS:
            if self.n > 1:  # vLLM's: n greedy sequences would all be the same
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}")
            # Greedy ignores truncation; resetting keeps batches from paying for it.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        # vLLM's private state, not fields: the engine's processor adds its EOS ids and the
        # bad_words' token sequences to its own copy (InputProcessor.process)
        self._all_stop_token_ids: set[int] = set(self.stop_token_ids)
        self._bad_words_token_ids: list[list[int]] | None = None

    def _verify_counts(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        _check_opt_count("max_tokens", self.max_tokens, 1)
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, got "
                             f"{self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):  # vLLM: True is 1, -1 the whole vocab
            if getattr(self, name) is True:
                setattr(self, name, 1)
            _check_opt_count(name, getattr(self, name), -1)

    def _verify_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_range(name, getattr(self, name), -2.0, 2.0, "in [-2, 2]")
            setattr(self, name, value)
        repetition = _check_real("repetition_penalty", self.repetition_penalty)
        if not (repetition > 0.0 and math.isfinite(repetition)):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition}")
        self.repetition_penalty = repetition

    def _verify_sampling(self) -> None:
        temperature = _check_real("temperature", self.temperature)
        if temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {temperature}")
        if not math.isfinite(temperature):
            raise ValueError(f"temperature must be finite, got {temperature}")
        if temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature}")
        if 0.0 < temperature < MIN_TEMPERATURE:  # vLLM's floor: logits / t would overflow
            logger.warning("temperature %g is below %g; it is set to %g", temperature,
                           MIN_TEMPERATURE, MIN_TEMPERATURE)
            temperature = MIN_TEMPERATURE
        top_p = _check_real("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p:g}")
        if not _is_int(self.top_k) or not -1 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or an integer in [1, "
                             f"{MAX_TOP_K}], got {self.top_k!r}")
        self.min_p = _check_range("min_p", self.min_p, 0.0, 1.0, "in [0, 1]")
        self.temperature, self.top_p = temperature, top_p
        self.top_k = max(self.top_k, 0)
        if self.seed == -1 and not isinstance(self.seed, bool):  # vLLM's spelling of "none"
            self.seed = None
        seed = self.seed
        if seed is not None and (not _is_int(seed) or not INT64_MIN <= seed <= INT64_MAX):
            raise ValueError(f"seed must be None or an integer in [-2**63, 2**63 - 1], "
                             f"got {seed!r}")

    def _verify_stops(self) -> None:
        self.stop = _normalise_stop(self.stop)
        self.stop_token_ids = _normalise_stop_ids(self.stop_token_ids)
        self.logit_bias = _normalise_logit_bias(self.logit_bias)
        self.allowed_token_ids = _normalise_allowed_ids(self.allowed_token_ids)
        if self.stop and not self.detokenize:
            raise ValueError("stop strings require detokenize=True")

    def _verify_misc(self) -> None:
        for name in ("ignore_eos", "detokenize", "skip_special_tokens",
                     "spaces_between_special_tokens", "include_stop_str_in_output"):
            _check_bool(name, getattr(self, name))
        procs = self.logits_processors
        if procs is not None:
            if not isinstance(procs, (list, tuple)) or not all(callable(p) for p in procs):
                raise ValueError(f"logits_processors must be a list of callables, got {procs!r}")
            self.logits_processors = list(procs)
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs,
                                                                 self.guided_decoding)
        self.guided_decoding = None
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    def _verify_vllm_extras(self) -> None:
        words = self.bad_words
        if words is not None and (not isinstance(words, (list, tuple)) or not all(
                isinstance(w, str) and w.strip() for w in words)):  # a bare str is refused
            raise ValueError(f"bad_words must be a list of non-blank strings, got {words!r}")
        self.bad_words = [check_text("bad_words", w) for w in dict.fromkeys(words or ())]
        keep = self.truncate_prompt_tokens
        if keep is not None and (not _is_int(keep) or keep == 0 or keep < -1):
            raise ValueError(f"truncate_prompt_tokens must be None, -1 or an integer >= 1, "
                             f"got {keep!r}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be None or a dict, got {self.extra_args!r}")

    @property
    def sampling_type(self) -> SamplingType:
        """GREEDY below SAMPLING_EPS, else RANDOM or (with a seed) RANDOM_SEED."""
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def all_stop_token_ids(self) -> set[int]:
        """vLLM's: stop_token_ids, plus the model's EOS ids once the engine has taken the
        request (min_tokens holds all of them back, ignore_eos or not)."""
        return self._all_stop_token_ids

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        """vLLM's: the token sequences bad_words ban, once the engine tokenized them."""
        return self._bad_words_token_ids

    @property
    def is_greedy(self) -> bool:
        """Whether the request takes the argmax token."""
        return self.sampling_type == SamplingType.GREEDY

    @property
    def needs_host_feedback(self) -> bool:
        """Sampling reads the previous token on the host (logits processors read the output
        ids, a grammar's bitmask follows them), so under async scheduling the step in flight
        lands before such a request's next sampling (penalties and min_tokens need no token
        on the host)."""
        return bool(self.logits_processors or self.structured_outputs is not None)

    @property
    def output_text_buffer_length(self) -> int:
        """Chars of decoded text to hold back so a partial stop string is never streamed."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1

    @staticmethod
    def from_optional(**fields: Any) -> SamplingParams:
        """vLLM's: SamplingParams where None stands for the default of n, the penalties,
        temperature and top_p (an OpenAI request's unset fields), and logit_bias keys may be
        token ids as strings, biases clamped to [-100, 100]; ValueError naming the field."""
        for name in ("n", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p"):
            if fields.get(name, 0) is None:
                del fields[name]
        if fields.get("logit_bias") is not None:
            fields["logit_bias"] = _logit_bias_from_json(fields["logit_bias"])
        return SamplingParams(**fields)

    def update_from_generation_config(self, generation_config: dict[str, Any],
                                      eos_token_id: int | None = None) -> None:
        """vLLM's: generation_config's eos_token_id (an id or a list) other than the primary
        eos_token_id become stop_token_ids, unless ignore_eos."""
        eos_ids = generation_config.get("eos_token_id")
        extra = [] if eos_ids is None else [eos_ids] if isinstance(eos_ids, int) else eos_ids
        primary = [] if eos_token_id is None else [eos_token_id]
        # vLLM's: every EOS id is in all_stop_token_ids (min_tokens holds them back), even
        # under ignore_eos
        self._all_stop_token_ids.update([*extra, *primary])
        if eos_ids is None or self.ignore_eos:
            return
        extra = [t for t in extra if t != eos_token_id]
        self.stop_token_ids = _normalise_stop_ids([*(self.stop_token_ids or []), *extra])

    def clone(self) -> SamplingParams:
        """Copy with fresh lists; processors and structured_outputs are shared (may hold state)."""
        procs = None if self.logits_processors is None else list(self.logits_processors)
        allowed = self.allowed_token_ids
        copy = dataclasses.replace(
            self,
            stop=list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            logits_processors=procs,
            logit_bias=None if self.logit_bias is None else dict(self.logit_bias),
            allowed_token_ids=None if allowed is None else list(allowed),
            bad_words=list(self.bad_words or []),
            extra_args=None if self.extra_args is None else dict(self.extra_args),
        )
        copy._all_stop_token_ids |= self._all_stop_token_ids
        copy._bad_words_token_ids = self._bad_words_token_ids
        return copy


@dataclass
class BeamSearchParams:
    """vLLM's LLM.beam_search settings: beam_width beams of at most max_tokens new tokens each,
    scored by cumulative logprob / length ** length_penalty (the length with the prompt's
    tokens, an ending EOS left out); temperature shapes the step's distribution."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.temperature, int | float) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
