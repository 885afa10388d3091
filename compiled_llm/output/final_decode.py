"""One-shot decoding of finished outputs that want their text only at the end.

Owns decode_output and decode_outputs: the text an incremental detokenizer would have built for
the same tokens, from a constant number of tokenizer calls per request (one batched call for
all the requests that finish in a step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from compiled_llm.output.detokenizer import (
    PROMPT_CONTEXT_TOKENS,
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
)
from compiled_llm.output.fast_detokenizer import DecodePlan, plan_for

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Trailing tokens tried when the whole output ends inside a character: a UTF-8 character has
# at most 4 bytes; longer runs of bad bytes are rare and go to the incremental replay.
_MAX_BACKOFF = 8


def _replay(
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
) -> str:
    det = IncrementalDetokenizer(
        tokenizer, list(prompt_token_ids), skip_special_tokens, spaces_between_special_tokens
    )
    det.add_tokens(list(output_token_ids))
    return det.output_text


def _per_request(flag: bool | Sequence[bool], count: int) -> list[bool]:
    return [flag] * count if isinstance(flag, bool) else list(flag)


def _held_back_text(plan: DecodePlan, context: list[int], output: list[int]) -> str | None:
    """The decode of context + output[:j] for the largest j after which it ends in a whole
    character, or None if that is more than _MAX_BACKOFF tokens back."""
    # One at a time: an incomplete character is usually one or two tokens long.
    for end in range(len(output) - 1, max(len(output) - 1 - _MAX_BACKOFF, -1), -1):
        text = plan.backend.decode(context + output[:end], skip_special_tokens=False)
        if not text.endswith(REPLACEMENT_CHAR):
            return text
    return None


def _finish(plan: DecodePlan, context: list[int], output: list[int], context_text: str,
            full: str) -> str | None:
    """The incremental text from the two decodes, or None where only a replay is exact."""
    if context_text.endswith(REPLACEMENT_CHAR):
        return None
    if full.endswith(REPLACEMENT_CHAR):
        # The incremental detokenizer stops at the last token after which the text was whole.
        full = _held_back_text(plan, context, output)
        if full is None:
            return None
    if not full.startswith(context_text):
        return None
    text = full[len(context_text) :]
    # A run of byte-fallback tokens that turned out invalid was rewritten as U+FFFDs after
    # part of it had been streamed; only the replay reproduces that streamed text.
    if plan.byte_ids and REPLACEMENT_CHAR in text:
        return None
    return text


def decode_outputs(
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    skip_special_tokens: bool | Sequence[bool] = True,
    spaces_between_special_tokens: bool | Sequence[bool] = True,
) -> list[str]:
    """The final text of each request, as IncrementalDetokenizer's output_text after all of
    output_token_ids (a trailing incomplete character held back).

    Invariant (tested over random ids): equal to that output_text for every request. Fast
    tokenizers: one batched decode for all requests (a second where an output ends inside a
    character); the rest, and slow tokenizers, replay the incremental detokenizer.
    """
    count = len(output_token_ids)
    skips = _per_request(skip_special_tokens, count)
    spaces = _per_request(spaces_between_special_tokens, count)
    plan = plan_for(tokenizer)
    requests = list(zip(prompt_token_ids, output_token_ids, skips, spaces))
    if plan.backend is None:
        return [_replay(tokenizer, *request) for request in requests]
    contexts = [plan.keep(p[-PROMPT_CONTEXT_TOKENS:], skip) for p, _, skip, _ in requests]
    outputs = [plan.keep(o, skip) for _, o, skip, _ in requests]
    wholes = [c + o for c, o in zip(contexts, outputs)]
    decoded = plan.backend.decode_batch(contexts + wholes, skip_special_tokens=False)
    texts = []
    for pos, request in enumerate(requests):
        text = _finish(plan, contexts[pos], outputs[pos], decoded[pos], decoded[count + pos])
        texts.append(_replay(tokenizer, *request) if text is None else text)
    return texts


def decode_output(
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> str:
    """decode_outputs for one request."""
    return decode_outputs(
        tokenizer,
        [prompt_token_ids],
        [output_token_ids],
        skip_special_tokens,
        spaces_between_special_tokens,
    )[0]
