"""What the pooling endpoints make of a request's fields beyond the basics: vLLM's fields this
server does not honour, refused by name when they ask for something (fields no API defines stay
ignored, as vLLM ignores them), and vectors as base64 in vLLM's embed_dtype and endianness."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from compiled_llm.entrypoints.server.errors import OpenAIError

# field -> (values that ask for nothing, why the field is refused)
Table = dict[str, tuple[tuple[Any, ...], str]]
_CHAT = "chat-style requests are taken by /v1/embeddings only; give input"
COMMON: Table = {
    "priority": ((None, 0), "request priorities are not supported"),
    "cache_salt": ((None,), "cache_salt (prefix-cache isolation) is not supported"),
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
    # the engine keeps the last truncate_prompt_tokens tokens: vLLM's 'left'
    "truncation_side": ((None, "left"), "truncate_prompt_tokens keeps the last tokens "
                                        "(truncation_side 'left') only"),
}
# the chat form of /v1/embeddings: the template adds the special tokens (vLLM's default)
CHAT_INPUT: Table = {
    **COMMON,
    "add_special_tokens": ((None, False), "add_special_tokens on chat-style input is not "
                                          "supported (the chat template adds them)"),
}
INPUT: Table = {
    **COMMON,
    "add_special_tokens": ((None, True), "add_special_tokens=false is not supported"),
    "messages": ((None,), _CHAT),
    "chat_template": ((None,), _CHAT),
    "chat_template_kwargs": ((None, {}), _CHAT),
    "add_generation_prompt": ((None, False), _CHAT),
    "continue_final_message": ((None, False), _CHAT),
}
_ORDER = {"native": "=", "little": "<", "big": ">"}


def require_input(value: Any) -> Any:
    """The body's input; a 400 naming it when it is missing."""
    if value is None:
        raise OpenAIError(400, "input: field required", param="input", code="invalid_value")
    return value


def check_embed_dtype(embed_dtype: str) -> None:
    """400 naming embed_dtype for the fp8 dtypes, which this server does not encode."""
    if embed_dtype.startswith("fp8"):
        raise OpenAIError(400, f"embed_dtype: {embed_dtype} is not supported; use float32, "
                          "float16 or bfloat16", param="embed_dtype", code="unsupported_field")


def encode_vector(vector: list[float], encoding_format: str, embed_dtype: str = "float32",
                  endianness: str = "native") -> list[float] | str:
    """A vector as floats, or as base64 of its embed_dtype values in endianness byte order
    (the defaults, native float32, are what OpenAI's client reads)."""
    if encoding_format != "base64":
        return vector
    if embed_dtype == "bfloat16":
        array = bfloat16_bits(vector)
    else:
        array = np.asarray(vector, dtype=np.float16 if embed_dtype == "float16" else np.float32)
    array = array.astype(array.dtype.newbyteorder(_ORDER[endianness]))
    return base64.b64encode(array.tobytes()).decode("ascii")


def bfloat16_bits(vector: list[float]) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of vector, rounded to nearest even as torch rounds
    (numpy has no bfloat16: it is float32's upper half)."""
    bits = np.asarray(vector, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
