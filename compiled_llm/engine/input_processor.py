"""Input processing: a user's prompt and SamplingParams become validated child Requests.
Tokenizes text prompts (after a size check), checks ids against the vocabulary, the engine's
limits, priority and length (after truncate_prompt_tokens), turns bad_words into a logits
processor, fans n > 1 out into n children (seeds offset per child) and attaches grammars.
Every check runs before anything is queued: a ValueError leaves no trace."""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import Future

from compiled_llm.config import EngineArgs
from compiled_llm.core.request import Request
from compiled_llm.engine.inputs import (
    check_prompt_keys,
    prompt_cache_salt,
    truncated_ids,
    truncated_text_ids,
)
from compiled_llm.lora.registry import LoRARegistry
from compiled_llm.models.rotary import long_rope_after
from compiled_llm.sample.bad_words import BadWordsProcessor, bad_word_sequences
from compiled_llm.sample.grammar_compiler import GrammarManager
from compiled_llm.sampling_params import (
    INT64_MAX,
    INT64_MIN,
    SamplingParams,
    StructuredOutputsParams,
    check_text,
)

PromptType = str | list[int] | dict
# A token covers at least one byte of text for byte-level and byte-fallback tokenizers, and
# rarely more than 16; 64 bytes a token refuses no prompt that could fit the context.
BYTES_PER_TOKEN_BOUND = 64


def is_token_ids(prompt: object) -> bool:
    """Whether prompt is a list of token ids: exact ints (a bool is not a token id)."""
    return isinstance(prompt, list) and all(type(t) is int for t in prompt)


class InputProcessor:
    """Builds the child requests of one user request; the grammar compiler starts on first
    use (costly for large vocabularies). Invariant: a request it returns passes every check
    a model step relies on (ids in the vocabulary, limits, a non-empty prompt that fits)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_model_len: int, args: EngineArgs, model_config=None) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.has_tokenizer_eos = getattr(tokenizer, "eos_token_id", None) is not None
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.scheduling_policy = args.scheduling_policy
        self.max_logprobs, self.max_n = args.max_logprobs, args.max_n_sequences
        self.max_stops = (args.max_stop_strings, args.max_stop_string_chars)
        self.max_prompt_bytes = args.max_prompt_bytes or BYTES_PER_TOKEN_BOUND * max_model_len
        self.grammar_limits = (args.structured_outputs_max_bytes, args.structured_outputs_timeout_s)
        self.grammars: GrammarManager | None = None
        self.attach_matchers = True  # False when the engine core builds its own matchers
        # before every child request id: unique among the front ends of a shared core
        self.request_id_prefix = ""
        self._grammars_lock = threading.Lock()  # the first grammar may come from any thread
        self.loras = LoRARegistry(args.enable_lora, args.max_lora_rank, model_config)
        self.long_rope_after = long_rope_after(model_config)
        self.long_rope_recompute = getattr(model_config, "long_rope_recompute", False)

    def check_text_prompt(self, text: str, name: str = "prompt") -> None:
        """ValueError unless text is valid UTF-8 of at most max_prompt_bytes bytes; called
        before tokenizing, so an oversized prompt costs no tokenizer time."""
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            check_text(name, text)  # raises, naming the field and the position
            raise
        if size > self.max_prompt_bytes:
            raise ValueError(f"{name} is {size} bytes; this engine tokenizes at most "
                             f"{self.max_prompt_bytes} (max_prompt_bytes)")

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}
        (with an optional cache_salt); ValueError for anything else (a dict key it does not
        read, a bad cache_salt included), an empty prompt or an id outside the vocabulary."""
        text = None
        if isinstance(prompt, dict):  # ids given with their text: the text is kept for output
            check_prompt_keys(prompt)
            text = prompt.get("prompt") if isinstance(prompt.get("prompt"), str) else None
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a text prompt needs a tokenizer")
            self.check_text_prompt(prompt)
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif is_token_ids(prompt):
            ids = prompt
        else:
            raise ValueError(f"prompt must be a str or a list of int token ids, got "
                             f"{_describe(prompt)}")
        if not ids:
            raise ValueError("prompt must not be empty (it has no tokens)")
        if not all(0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"prompt_token_ids must be ids in [0, {self.vocab_size})")
        return text, ids

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams,
                priority: int = 0, lora_request=None) -> list[Request]:
        """The request's n child sequences, validated, with grammars attached; lora_request
        (a LoRARequest, None: the base model) is checked to load. The prompt is cut to its
        last truncate_prompt_tokens tokens, bad_words become a logits processor, and a prompt
        dict's cache_salt goes on every child."""
        self._check_priority(priority)
        self.check_params(params)
        text, ids = self.tokenize(prompt)
        ids = self._truncated(prompt, text, ids, params.truncate_prompt_tokens)
        params = self._with_bad_words(self._with_whole_vocab(params.clone()))
        params._all_stop_token_ids.update(self.eos_token_ids)  # vLLM's all_stop_token_ids
        lora = self.loras.check(lora_request)
        salt = prompt_cache_salt(prompt)  # checked by tokenize
        children = [self._child(request_id, i, text, ids, params, priority, lora, salt)
                    for i in range(params.n)]
        for child in children:  # check all before queueing any
            self._check_fits(child)
        if params.structured_outputs is not None:
            self._attach_grammars(children, params.structured_outputs)
        return children

    def _truncated(self, prompt: PromptType, text: str | None, ids: list[int],
                   keep: int | None) -> list[int]:
        """ids cut to their last `keep` tokens (truncate_prompt_tokens); a prompt this engine
        tokenized keeps the special tokens its tokenizer adds (a BOS), as vLLM's does."""
        tokenized = isinstance(prompt, str) or (isinstance(prompt, dict)
                                                and "prompt_token_ids" not in prompt)
        if tokenized and text is not None:
            return truncated_text_ids(self.tokenizer, text, ids, keep, self.max_model_len)
        return truncated_ids(ids, keep, self.max_model_len)

    def check_params(self, params: SamplingParams) -> None:
        """ValueError naming the field for what only the engine can check: its limits on n,
        logprobs and truncate_prompt_tokens, and token ids against the model's vocabulary."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {_describe(params)}")
        if params.n > self.max_n:
            raise ValueError(f"n must be <= {self.max_n} (max_n_sequences), got {params.n}")
        self._check_stops(params.stop)
        keep = params.truncate_prompt_tokens
        if keep is not None and keep > self.max_model_len:  # vLLM's check, whatever the prompt
            raise ValueError(f"truncate_prompt_tokens must be <= max_model_len "
                             f"({self.max_model_len}), got {keep}")
        limit = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and (self.vocab_size if value == -1 else value) > limit:
                raise ValueError(f"{name} must be <= {limit} (max_logprobs; -1 "
                                 f"asks for the whole vocabulary), got {value}")
        for name, ids in (("stop_token_ids", params.stop_token_ids),
                          ("logit_bias", params.logit_bias or ()),
                          ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise ValueError(f"{name} must be token ids in [0, {self.vocab_size}), got "
                                 f"{bad[:5]}")
        if params.extra_args:  # it travels to the engine-core process with the request
            try:
                pickle.dumps(params.extra_args)
            except Exception as exc:
                raise ValueError(f"extra_args must be picklable ({exc})") from None

    def _with_whole_vocab(self, params: SamplingParams) -> SamplingParams:
        """params (the engine's copy) with logprobs -1 (the whole vocabulary) as the
        vocabulary's size."""
        if -1 not in (params.logprobs, params.prompt_logprobs):
            return params
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(params, name) == -1:
                setattr(params, name, self.vocab_size)
        return params

    def _with_bad_words(self, params: SamplingParams) -> SamplingParams:
        """params (the engine's copy) with a processor banning its bad_words (their token
        sequences in bad_words_token_ids, as vLLM's); params when it has none."""
        if not params.bad_words:
            return params
        sequences = bad_word_sequences(self.tokenizer, params.bad_words, self.vocab_size)
        params._bad_words_token_ids = sequences
        params.logits_processors = [*(params.logits_processors or []),
                                    BadWordsProcessor(sequences)]
        return params

    def _check_stops(self, stops: list[str]) -> None:
        # every stop string is searched for, and its prefixes held back, at every token
        most, longest = self.max_stops
        if len(stops) > most:
            raise ValueError(f"stop must hold at most {most} strings (max_stop_strings), got "
                             f"{len(stops)}")
        if any(len(stop) > longest for stop in stops):
            raise ValueError(f"stop strings must be at most {longest} characters "
                             "(max_stop_string_chars)")

    def _child(self, request_id: str, index: int, text: str | None, ids: list[int],
               params: SamplingParams, priority: int, lora=None,
               salt: str | None = None) -> Request:
        child_params = params
        if params.n > 1:
            child_params = params.clone()
            child_params.n = 1
            if child_params.seed is not None:
                child_params.seed = _wrap_int64(child_params.seed + index)
            if index > 0:  # one child reports the prompt's logprobs
                child_params.prompt_logprobs = None
        child_id = self.request_id_prefix + (
            request_id if params.n == 1 else f"{index}_{request_id}")
        long_rope = self.long_rope_after is not None and len(ids) > self.long_rope_after
        switch_at = None if long_rope or not self.long_rope_recompute else self.long_rope_after
        return Request(child_id, list(ids), child_params, self.eos_token_ids, text,
                       priority=priority, parent_id=request_id, lora_request=lora,
                       cache_salt=salt, long_rope=long_rope, long_rope_at=switch_at,
                       tokenizer_eos=self.has_tokenizer_eos)

    def _check_priority(self, priority: int) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"priority={priority} needs scheduling_policy='priority' "
                             f"(the engine uses {self.scheduling_policy!r})")

    def _check_fits(self, req: Request) -> None:
        if req.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt is {req.num_prompt_tokens} tokens, max_model_len is "
                f"{self.max_model_len}; the prompt plus output must fit"
            )

    def prepare_grammar(self, params: SamplingParams) -> Future | None:
        """Start compiling params' grammar on the compiler's threads: a future of it (await
        it before add_request to keep the engine thread from waiting), None without one;
        ValueError now for a spec refused outright. Thread-safe."""
        spec = params.structured_outputs if isinstance(params, SamplingParams) else None
        return None if spec is None else self.grammar_manager().prepare(spec)

    def grammar_manager(self) -> GrammarManager:
        """The grammar compiler for this tokenizer, built on first use (any thread)."""
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer")
        with self._grammars_lock:
            if self.grammars is None:
                max_bytes, timeout_s = self.grammar_limits
                self.grammars = GrammarManager(self.tokenizer, self.vocab_size,
                                               self.eos_token_ids, max_bytes, timeout_s)
            return self.grammars

    def _attach_grammars(self, children: list[Request], spec: StructuredOutputsParams) -> None:
        grammars = self.grammar_manager()
        grammars.compile(spec)  # raises ValueError before any child gets a matcher
        if not self.attach_matchers:
            return
        for child in children:
            child.grammar = grammars.matcher(spec)


def _wrap_int64(value: int) -> int:
    """value folded into [-2**63, 2**63 - 1] (a child's seed past the top wraps around)."""
    return (value - INT64_MIN) % (1 << 64) + INT64_MIN if value > INT64_MAX else value


def _describe(value: object) -> str:
    """A short description of a wrong value for an error message (no 10 MB reprs)."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
