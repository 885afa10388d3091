"""Prompt types as vLLM spells them (TextPrompt, TokensPrompt, PromptType), and the check that
a prompt dict holds only keys this text-only engine reads (prompt, prompt_token_ids and
cache_salt): any other key (multi_modal_data, mm_processor_kwargs ...) is refused by name, never
silently dropped; and truncate_prompt_tokens's cut, which keeps a text prompt's BOS as vLLM's."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine; cache_salt isolates its prefix-cache blocks."""

    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A tokenized prompt; prompt, when given, is its text (shown as the output's prompt)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    cache_salt: NotRequired[str]


PromptType = str | list[int] | TextPrompt | TokensPrompt

PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})
# why a key vLLM defines is refused here (anything else is simply unknown)
_REFUSED = {
    "multi_modal_data": "multimodal inputs are not supported: this is a text-only engine",
    "mm_processor_kwargs": "multimodal inputs are not supported: this is a text-only engine",
    "multi_modal_uuids": "multimodal inputs are not supported: this is a text-only engine",
    "prompt_embeds": "prompt embeddings are not supported",
    "token_type_ids": "token_type_ids are for cross-encoders (runner='pooling')",
    "encoder_prompt": "encoder-decoder prompts are not supported",
    "decoder_prompt": "encoder-decoder prompts are not supported",
}


def check_prompt_keys(prompt: dict[str, Any]) -> None:
    """ValueError naming the first key of a prompt dict that the engine does not read, so
    that nothing a caller sent is ignored without a word, or naming a bad cache_salt."""
    extra = [key for key in prompt if key not in PROMPT_KEYS]
    if not extra:
        prompt_cache_salt(prompt)
        return
    key = extra[0]
    why = _REFUSED.get(key) if isinstance(key, str) else None
    if why is None:
        why = f"a prompt dict takes only {sorted(PROMPT_KEYS)}"
    raise ValueError(f"prompt: {key!r} is not supported ({why})")


def prompt_cache_salt(prompt: Any) -> str | None:
    """The cache_salt of a prompt dict (None without one); ValueError naming cache_salt for
    anything but a non-empty str."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        shown = repr(salt) if len(repr(salt)) <= 60 else repr(salt)[:57] + "..."
        raise ValueError(f"cache_salt must be a non-empty string, got {type(salt).__name__} "
                         f"{shown}")
    return salt


def truncated_ids(ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """ids cut to their last `keep` tokens (truncate_prompt_tokens); -1 keeps the most that
    leave room for one output token within max_model_len; None keeps them all."""
    if keep is None:
        return ids
    keep = max_model_len - 1 if keep == -1 else keep
    return ids[-keep:] if len(ids) > keep else ids


def truncated_text_ids(tokenizer: Any, text: str, ids: list[int], keep: int | None,
                       max_model_len: int, add_special_tokens: bool = True) -> list[int]:
    """A text prompt's ids (text encoded, with the tokenizer's special tokens unless
    add_special_tokens is off) cut as vLLM cuts a text prompt, by the tokenizer truncating from
    the left: the text's own tokens lose their start, the special tokens the tokenizer adds (a
    BOS) stay, as many tokens in all as truncated_ids keeps."""
    cut = truncated_ids(ids, keep, max_model_len)
    if len(cut) == len(ids) or not add_special_tokens:
        return cut
    body = tokenizer.encode(text, add_special_tokens=False)
    start = next((i for i in range(len(ids) - len(body) + 1)
                  if ids[i:i + len(body)] == body), None) if len(body) < len(ids) else None
    if start is None:  # the tokenizer added nothing (or not around the text): a plain cut
        return cut
    head, tail = ids[:start], ids[start + len(body):]
    room = len(cut) - len(head) - len(tail)
    return head + (body[-room:] if room > 0 else []) + tail


def with_text(prompt: Any, prompt_text: str | None) -> Any:
    """prompt with its text set to prompt_text (vLLM's argument for a token prompt)."""
    if prompt_text is None:
        return prompt
    if not isinstance(prompt_text, str):
        raise ValueError("prompt_text must be a str")
    if isinstance(prompt, list):
        return {"prompt_token_ids": prompt, "prompt": prompt_text}
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return {**prompt, "prompt": prompt_text}
    raise ValueError("prompt_text names the text of a token prompt; this prompt has its text")
