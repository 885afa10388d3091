"""Input processing: a user's prompt and SamplingParams become validated child Requests.

Tokenizes text prompts, checks token ids, priority and length, fans n > 1 out into n child
sequences (seeds offset per child) and attaches structured-output matchers. Every check runs
before anything is queued, so a ValueError (naming the field) leaves no trace.
"""

from __future__ import annotations

from compiled_llm.core.request import Request
from compiled_llm.sample.structured_outputs import GrammarManager
from compiled_llm.sampling_params import SamplingParams, StructuredOutputsParams

PromptType = str | list[int] | dict


class InputProcessor:
    """Builds the child requests of one user request; the grammar compiler starts on first
    use (costly for large vocabularies)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_model_len: int, scheduling_policy: str) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.scheduling_policy = scheduling_policy
        self.grammars: GrammarManager | None = None

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) for a str, a token-id list, or {"prompt"|"prompt_token_ids": ...}."""
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a text prompt needs a tokenizer")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            if not prompt or any(t < 0 or t >= self.vocab_size for t in prompt):
                raise ValueError(
                    f"prompt_token_ids must be non-empty ids in [0, {self.vocab_size})")
            return None, prompt
        raise ValueError(f"prompt must be a str or a list of token ids, got {type(prompt)}")

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams,
                priority: int = 0) -> list[Request]:
        """The request's n child sequences, validated, with grammars attached."""
        self._check_priority(priority)
        text, ids = self.tokenize(prompt)
        children = [self._child(request_id, i, text, ids, params, priority)
                    for i in range(params.n)]
        for child in children:  # check all before queueing any
            self._check_fits(child)
        if params.structured_outputs is not None:
            self._attach_grammars(children, params.structured_outputs)
        return children

    def _child(self, request_id: str, index: int, text: str | None, ids: list[int],
               params: SamplingParams, priority: int) -> Request:
        child_params = params
        if params.n > 1:
            child_params = params.clone()
            child_params.n = 1
            if child_params.seed is not None:
                child_params.seed += index
            if index > 0:  # one child reports the prompt's logprobs
                child_params.prompt_logprobs = None
        child_id = request_id if params.n == 1 else f"{index}_{request_id}"
        return Request(child_id, list(ids), child_params, self.eos_token_ids, text,
                       priority=priority, parent_id=request_id)

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

    def _attach_grammars(self, children: list[Request], spec: StructuredOutputsParams) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer")
        if self.grammars is None:
            self.grammars = GrammarManager(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.grammars.compile(spec)  # raises ValueError before any child gets a matcher
        for child in children:
            child.grammar = self.grammars.matcher(spec)
