"""Request fields the OpenAI API or vLLM define that this server does not honour: each one, set
to anything but its neutral value, is a 400 naming it, never silently dropped; and message
content parts other than text. Fields no API defines stay ignored, as vLLM ignores them."""

from __future__ import annotations

import logging
from typing import Any

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import TEXT_PART_KEYS

logger = logging.getLogger(__name__)
_BEAM = "beam search is not supported"
# vLLM's fields kept in model_extra and read there (params.py): honoured, not ignored
_READ_EXTRA = frozenset({"truncate_prompt_tokens", "bad_words", "documents"})

# field -> (values that ask for nothing, why the field is refused)
_BOTH: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((None, False), _BEAM),
    "length_penalty": ((None, 1, 1.0), f"length_penalty needs beam search; {_BEAM}"),
    "early_stopping": ((None, False), f"early_stopping needs beam search; {_BEAM}"),
    "logits_processors": ((None, []), "logits processors by name are not supported"),
    "prompt_embeds": ((None,), "prompt embeddings are not supported"),
    "guided_whitespace_pattern": ((None,), "a whitespace pattern for JSON is not supported"),
    "guided_decoding_backend": ((None, "auto", "xgrammar"), "the structured-output backend "
                                                            "is xgrammar"),
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "kv_transfer_params": ((None,), "KV transfer (disaggregated prefill) is not supported"),
    "vllm_xargs": ((None, {}), "vllm_xargs (custom logits processor arguments) is not "
                               "supported"),
    "ec_transfer_params": ((None,), "encoder-cache transfer is not supported"),
    "logprob_token_ids": ((None,), "logprobs of chosen token ids are not supported; use "
                                   "logprobs / top_logprobs"),
    "repetition_detection": ((None,), "repetition detection is not supported"),
    "stream_interval": ((None, 1), "a stream_interval above 1 is not supported (every step's "
                                   "tokens are sent)"),
    "watermarking": ((None, False), "watermarking is not supported"),
    # truncate_prompt_tokens keeps the last tokens: vLLM's "left"
    "truncation_side": ((None, "left"), "only 'left' (truncate_prompt_tokens keeps the last "
                                        "tokens) is supported"),
}
_CHAT: dict[str, tuple[tuple[Any, ...], str]] = {
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    "store": ((None, False), "store=true is not supported: this server keeps no completions"),
    "verbosity": ((None,), "verbosity is not supported"),
    "functions": ((None, []), "functions (deprecated) is not supported; use tools"),
    "function_call": ((None,), "function_call (deprecated) is not supported; use "
                               "tool_choice"),
    "media_io_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "return_prompt_text": ((None, False), "return_prompt_text is not supported; /tokenize "
                                          "with the messages gives the rendered prompt's ids"),
}


def refuse_unsupported(extra: dict[str, Any] | None, chat: bool) -> None:
    """400 for the first field of extra (a body's fields beyond those modelled) that is
    defined for the endpoint, not honoured here, and set to ask for something; the fields
    left are ignored with a warning naming them, as vLLM's (a misspelt field leaves a trace)."""
    table = {**_BOTH, **_CHAT} if chat else _BOTH
    refuse_fields(extra, table)
    ignored = sorted(set(extra or ()) - set(table) - _READ_EXTRA)
    if ignored:
        logger.warning("The following fields were present in the request but ignored: %s",
                       ignored)


def refuse_fields(extra: dict[str, Any] | None,
                  table: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    """400 naming the first field of extra that table (field -> (neutral values, why))
    lists and that asks for something."""
    for name, value in (extra or {}).items():
        if name not in table:
            continue
        neutral, why = table[name]
        if not any(value == ok and type(value) is type(ok) for ok in neutral):
            raise OpenAIError(400, f"{name}: {why}", param=name, code="unsupported_field")


def refuse_non_text_parts(messages: list) -> None:
    """400 naming the first content part of messages that is not text (images, audio,
    files: this server serves text-only models), or a text part without its text. Text parts
    are vLLM's: text, input_text and output_text, refusal and thinking (by their own keys)."""
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            key = TEXT_PART_KEYS.get(part.type)
            if key is None:
                raise OpenAIError(400, f"{where}: {part.type} content parts are not supported; "
                                  "this server takes text parts only", param=where,
                                  code="unsupported_content")
            if not isinstance(part.part_text(), str):
                raise OpenAIError(400, f"{where}.{key}: a {part.type} part needs its {key} (a "
                                  "string)", param=f"{where}.{key}", code="invalid_type")
