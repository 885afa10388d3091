"""Request bodies of the pooling endpoints (pydantic), as OpenAI and vLLM spell them:
/v1/embeddings, /pooling, /classify, /v1/score and /v1/rerank. Types are checked here; values
(lengths, dimensions, truncation) by the engine, whose ValueError names the field. Fields beyond
these stay in model_extra, where vLLM's own but unhonoured ones are refused (pooling_fields.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, StrictBool, StrictInt, StrictStr, model_validator

from compiled_llm.entrypoints.server.protocol import ChatMessage, Count, RequestBody

# OpenAI's input: one text, texts, one token-id list, or token-id lists
EmbeddingInput = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
# vLLM's embed_dtype values; the fp8 ones are refused by name (pooling_fields.py)
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


class PoolingBody(RequestBody):
    """Fields every pooling request takes (vLLM's PoolingBasicRequestMixin)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Count | None = None  # vLLM's extra
    request_id: StrictStr | None = None  # vLLM's extra: the response's id carries it


class ActivationFields(PoolingBody):
    """vLLM's classifier fields: use_activation, and its deprecated spellings."""

    use_activation: StrictBool | None = None
    softmax: StrictBool | None = None
    activation: StrictBool | None = None

    def wants_activation(self) -> bool:
        """vLLM's reading: the first of use_activation, softmax, activation set; else True."""
        for value in (self.use_activation, self.softmax, self.activation):
            if value is not None:
                return value
        return True

    def activation_field(self) -> str | None:
        """The name of the first activation field set, or None."""
        for name in ("use_activation", "softmax", "activation"):
            if getattr(self, name) is not None:
                return name
        return None


class EmbeddingRequest(PoolingBody):
    """POST /v1/embeddings. input is optional only so that a body with vLLM's chat-style
    messages instead is refused by that name; the handler requires it."""

    input: EmbeddingInput | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embed_dtype: EmbedDType = "float32"  # vLLM's extra: the dtype of base64 vectors
    endianness: Literal["native", "little", "big"] = "native"  # vLLM's extra, base64 too
    dimensions: Count | None = None
    normalize: bool | None = None  # vLLM's extra: None keeps the model's setting


class PoolingRequest(EmbeddingRequest, ActivationFields):
    """POST /pooling: the pooler's raw output; task, if set, must be the model's."""

    task: StrictStr | None = None


class ClassificationRequest(ActivationFields):
    """POST /classify: class probabilities and the top label per input."""

    input: EmbeddingInput | None = None


# vLLM's other spellings of the score pair (its ScoreRequest variants), read as text_1/text_2
SCORE_ALIASES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


class ScoreRequest(ActivationFields):
    """POST /v1/score: text_1 against each text_2 (or the two lists zipped); vLLM's
    queries/documents, queries/items and data_1/data_2 spell the same pair."""

    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, body: object) -> object:
        """text_1/text_2 from the first alias pair the body has, when it has neither."""
        if not isinstance(body, dict) or "text_1" in body or "text_2" in body:
            return body
        for first, second in SCORE_ALIASES:
            if first in body and second in body:
                rest = {k: v for k, v in body.items() if k not in (first, second)}
                return {**rest, "text_1": body[first], "text_2": body[second]}
        return body


class RerankRequest(ActivationFields):
    """POST /v1/rerank (Jina and Cohere shape): documents ordered by relevance to query."""

    query: StrictStr
    documents: list[StrictStr]
    top_n: Count | None = None  # None or 0 (vLLM's default): every document
    return_documents: bool = True


class EmbeddingChat(RequestBody):
    """vLLM's chat form of /v1/embeddings (its EmbeddingChatRequest): messages rendered by the
    chat template (no generation prompt by default), then embedded as one input."""

    messages: list[ChatMessage]
    add_generation_prompt: StrictBool = False
    continue_final_message: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
